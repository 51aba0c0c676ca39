"""`navrl-daemon run`: for now a plain collect → update loop around `rl.training`.

The staged anyio pipeline of DESIGN.md §2 replaces this loop (issue #3) and reuses
`Training` as it is. What this loop already guarantees: it ends at `run.total_frames` or at
the iteration boundary after SIGINT/SIGTERM, and saves the policy in NavRL's layout.
"""

from __future__ import annotations

import json
import signal
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import structlog
import torch
from tqdm import tqdm

from navrl_daemon import __version__
from navrl_daemon.config import Config, resolve_device, to_toml
from navrl_daemon.rl.training import IterationResult, Training
from navrl_daemon.storage.atomic import append_line, write_atomic
from navrl_daemon.storage.policy_file import save_policy_state

log = structlog.get_logger("daemon")


class StopRequest:
    """Set by the first SIGINT/SIGTERM; a second SIGINT falls back to KeyboardInterrupt."""

    def __init__(self) -> None:
        self.signal: str | None = None

    def __bool__(self) -> bool:
        return self.signal is not None


@contextmanager
def stop_on_signals() -> Iterator[StopRequest]:
    stop = StopRequest()

    def handler(signum: int, _frame: FrameType | None) -> None:
        stop.signal = signal.Signals(signum).name
        log.info("stop requested", signal=stop.signal, note="stopping after this iteration")
        signal.signal(signal.SIGINT, signal.default_int_handler)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def run(cfg: Config, state_dir: Path) -> int:
    device = resolve_device(cfg)
    if cfg.run.torch_threads:
        torch.set_num_threads(cfg.run.torch_threads)
    state_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(state_dir / "config.toml", to_toml(cfg).encode())
    log.info(
        "starting",
        version=__version__,
        torch=torch.__version__,
        device=device,
        state_dir=str(state_dir),
        num_envs=cfg.env.num_envs,
        frames_per_iteration=cfg.frames_per_iteration,
        total_frames=cfg.run.total_frames,
    )
    with stop_on_signals() as stop:
        training = Training.build(cfg, device)
        total = cfg.run.total_frames
        bar = tqdm(total=total, unit="frame", unit_scale=True, disable=not sys.stderr.isatty())
        window: list[IterationResult] = []
        window_start = time.perf_counter()
        while training.frames < total and not stop:
            result = training.step()
            bar.update(cfg.frames_per_iteration)
            window.append(result)
            if result.iteration % cfg.log.summary_interval == 0:
                now = time.perf_counter()
                _log_progress(training, window, now - window_start)
                window, window_start = [], now
            if cfg.eval.interval and result.iteration % cfg.eval.interval == 0:
                _evaluate(training, state_dir)
        bar.close()
        export = state_dir / "export" / "policy.pt"
        save_policy_state(export, training.policy.state_dict())
        log.info(
            "stopped",
            reason=stop.signal or "total_frames reached",
            iteration=training.iteration,
            frames=training.frames,
            policy=str(export),
        )
    return 0


def _log_progress(training: Training, window: list[IterationResult], seconds: float) -> None:
    frames = training.cfg.frames_per_iteration * len(window)
    losses = {k: statistics.fmean(r.losses[k] for r in window) for k in window[-1].losses}
    log.info(
        "progress",
        iteration=training.iteration,
        frames=training.frames,
        frames_per_second=round(frames / seconds, 1),
        collect_s=round(statistics.fmean(r.collect_s for r in window), 4),
        update_s=round(statistics.fmean(r.update_s for r in window), 4),
        **{f"train_{k}": _round(v) for k, v in training.episodes.take().items()},
        **{k: _round(v) for k, v in losses.items()},
    )


def _evaluate(training: Training, state_dir: Path) -> dict[str, float]:
    t0 = time.perf_counter()
    results = training.evaluate()
    record = {
        "iteration": training.iteration,
        "frames": training.frames,
        "time": time.time(),
        "seconds": round(time.perf_counter() - t0, 3),
        **results,
    }
    append_line(state_dir / "eval" / "results.jsonl", json.dumps(record))
    log.info("evaluation", **{k: _round(v) for k, v in record.items()})
    return results


def _round(v: float | int | str) -> float | int | str:
    return round(v, 4) if isinstance(v, float) else v
