"""Progress reporting: one summary log line every `log.summary_interval` iterations, or
sooner when `log.summary_seconds` passed since the last one.

Fed by the trainer's per-iteration records; the summary carries frames/s over the window,
per stage and phase the mean/std/min/max duration and the busy ratio (time in the phase /
wall time), the policy lag, how many training episodes finished (`train_episodes`, 0 when
none) and their mean stats, and the mean losses. The log line also carries `total_frames`
and `eta_s`. A progress bar is drawn when stderr is a terminal; ops/console.py keeps log
lines off it and renders the summary as a table there.

The ETA and the bar's rate count this sitting's frames only (from `starts_at`: 0, or the
checkpoint a run resumed from) over this sitting's wall time: a resumed run's earlier
frames are not throughput, and the bar and the summary's ETA say the same. Inside an
iteration (minutes on a CPU) the bar says what runs now, for how long, beside how long it
took the last time (`phase`, redrawn by `tick`).
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
import torch
from tqdm import tqdm

from navrl_daemon.rl.rollout import EpisodeStats

log = structlog.get_logger("progress")
NONE = {"episodes": 0}  # a window in which no training episode finished


@dataclass(frozen=True)
class IterationRecord:
    # The policy version after this iteration's update: one update per iteration.
    iteration: int
    frames: int
    policy_lag: int
    collect_s: float
    update_s: float
    losses: dict[str, float]
    episodes: tuple[torch.Tensor, torch.Tensor]
    rolled_back: bool = False


class ProgressLog:
    def __init__(
        self,
        *,
        summary_interval: int,
        total_frames: int,
        device: torch.device | str,
        on_summary: Callable[[dict[str, Any]], None] = lambda _: None,
        start_frames: int = 0,
        summary_seconds: float = 0.0,
        context: Callable[[], dict[str, Any]] = dict,
        phase_labels: dict[str, str] | None = None,
    ) -> None:
        self.summary_interval = summary_interval
        self.summary_seconds = summary_seconds
        self.total_frames = total_frames
        self.on_summary = on_summary
        # Where training is (curriculum stage, density levels): in the log line only.
        self.context = context
        self.episodes = EpisodeStats(device)
        self.window: list[IterationRecord] = []
        self.bar: tqdm | None = None  # drawn from `starts_at` (or the first record) on
        self.phase_labels = phase_labels or {}
        self._running: dict[str, float] = {}  # phase -> when it started
        self._done: dict[str, tuple[int, int]] = {}  # phase -> (steps done, of total)
        self._noted: dict[str, float] = {}  # phase -> when its progress was last logged
        self._last: dict[str, float] = {}  # phase -> its seconds in the last iteration
        self.starts_at(start_frames)

    def starts_at(self, frames: int) -> None:
        """This sitting starts now, at `frames`: the first window, the ETA's rate and the
        bar count from here."""
        self.sitting_start = self.window_start = time.perf_counter()
        self.sitting_frames = self.window_frames = frames
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __call__(self, record: IterationRecord) -> None:
        self.window.append(record)
        self.episodes.merge(record.episodes)
        if self.bar is None:
            self.bar = self._bar()
        self.bar.update(record.frames - self.bar.n)
        self._last.update(collect=record.collect_s, update=record.update_s)
        waited = time.perf_counter() - self.window_start
        if record.iteration % self.summary_interval == 0 or (
            self.summary_seconds and waited >= self.summary_seconds
        ):
            self.summarise()

    def phase(self, name: str, running: bool) -> None:
        """`name` ("collect", "update") starts or ends; from any thread."""
        if running:
            self._running[name] = self._noted[name] = time.perf_counter()
        else:
            self._running.pop(name, None)
            self._done.pop(name, None)

    def phase_progress(self, name: str, done: int, total: int) -> None:
        """`done` of the running phase's `total` steps are done (the update's minibatch
        steps); from any thread."""
        self._done[name] = (done, total)

    def tick(self) -> None:
        """Redraw the bar's note: each running phase's steps done and time so far beside
        the last one's (`updating 4×16 minibatches 37/64 0:41 of ~1:20`). Off a terminal,
        a phase running longer than `summary_seconds` logs its steps done that often."""
        now = time.perf_counter()
        if not _on_terminal():
            self._log_long_phases(now)
            return
        if self.bar is None:
            self.bar = self._bar()
        notes = []
        for name, since in list(self._running.items()):
            last = self._last.get(name)
            of = f" of ~{_clock(last)}" if last else ""
            steps = self._done.get(name)  # read once: another thread may end the phase
            done = f"{steps[0]}/{steps[1]} " if steps else ""
            label = self.phase_labels.get(name, name)
            notes.append(f"{label} {done}{_clock(now - since)}{of}")
        self.bar.set_postfix_str(" · ".join(notes), refresh=True)

    def _log_long_phases(self, now: float) -> None:
        if not self.summary_seconds:
            return
        for name, since in list(self._running.items()):
            steps = self._done.get(name)
            if steps is None or now - self._noted.get(name, since) < self.summary_seconds:
                continue
            self._noted[name] = now
            done, total = steps
            log.info(f"{name} in progress", done=done, total=total, seconds=round(now - since))

    def summarise(self) -> dict[str, Any] | None:
        if not self.window:
            return None
        now = time.perf_counter()
        last = self.window[-1]
        wall = max(now - self.window_start, 1e-9)
        collect = [r.collect_s for r in self.window]
        update = [r.update_s for r in self.window]
        summary: dict[str, Any] = {
            "iteration": last.iteration,
            "frames": last.frames,
            "frames_per_second": round((last.frames - self.window_frames) / wall, 1),
            "policy_lag": _mean(r.policy_lag for r in self.window),
            "phases": {"producer.collect": _spread(collect), "trainer.update": _spread(update)},
            "busy": {
                "producer": round(sum(collect) / wall, 3),
                "trainer": round(sum(update) / wall, 3),
            },
            **{f"train_{k}": _round(v) for k, v in (self.episodes.take() or NONE).items()},
            **_mean_losses(self.window),
        }
        sitting = (last.frames - self.sitting_frames) / max(now - self.sitting_start, 1e-9)
        eta = (self.total_frames - last.frames) / sitting if sitting > 0 else None
        log.info(
            "progress",
            **summary,
            **self.context(),
            total_frames=self.total_frames,
            eta_s=None if eta is None else round(max(eta, 0.0), 1),
        )
        self.on_summary(summary)
        self.window, self.window_start, self.window_frames = [], now, last.frames
        return summary

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def _bar(self) -> tqdm:
        """The bar from this sitting's start: its rate is the mean since then (smoothing 0),
        the rate the summary's ETA uses."""
        # tqdm's default lock is a multiprocessing RLock, which starts a resource-tracker
        # child process: a daemon should not have one (it outlives a kill -9 of ours).
        tqdm.set_lock(threading.RLock())
        bar = tqdm(
            total=self.total_frames,
            initial=self.sitting_frames,
            unit="frame",
            unit_scale=True,
            smoothing=0,
            disable=sys.stderr is None or not sys.stderr.isatty(),
        )
        if not bar.disable:  # its clock: the sitting's
            bar.start_t -= time.perf_counter() - self.sitting_start
        return bar


def _on_terminal() -> bool:
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):
        return False


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}:{secs:02d}"


def _mean(values: Any) -> float:
    """4 decimals, or 4 significant digits below 0.01 (a decayed learning rate)."""
    mean = statistics.fmean(values)
    return round(mean, 4) if abs(mean) >= 0.01 else float(f"{mean:.4g}")


def _mean_losses(window: list[IterationRecord]) -> dict[str, float]:
    """Each loss over the records that have it: a rolled-back iteration has none but
    `rolled_back`."""
    names = dict.fromkeys(k for r in window for k in r.losses)
    return {k: _mean(r.losses[k] for r in window if k in r.losses) for k in names}


def _spread(values: list[float]) -> dict[str, float]:
    """mean/std/min/max of a phase's durations over the window, in seconds."""
    return {
        "mean": round(statistics.fmean(values), 4),
        "std": round(statistics.pstdev(values), 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
    }


def _round(v: float | int) -> float | int:
    return round(v, 4) if isinstance(v, float) else v
