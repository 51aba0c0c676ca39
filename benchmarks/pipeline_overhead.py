"""Pipeline overhead: frames/s of the staged daemon vs the core's bare loop, as JSON.

Same config, same process, alternating runs:
- `bare`: `rl.training.Training.step()` in a plain loop (collect, then update);
- `daemon_lag0`: `navrl-daemon run`'s pipeline with max_policy_lag = 0 (on-policy, NavRL);
- `daemon_lag1`: the same with max_policy_lag = 1 (collect i+1 while training i).
Evaluation is off, so only the producer/trainer path is measured. Each run skips
`--warmup` iterations and times the next `--iterations`; frames/s is measured over
iteration completions in both cases. Ratios are medians over `--repeats` runs. Every
run is a fresh process: a process that has run torch CPU kernels on two threads keeps two
OpenMP teams and runs slower on both (see navrl_daemon/runtime/compute.py).

Run: `.venv/bin/python benchmarks/pipeline_overhead.py [--device cuda]`
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import torch

from navrl_daemon.config import Config, load_config
from navrl_daemon.ops.logging import configure_logging
from navrl_daemon.ops.progress import IterationRecord
from navrl_daemon.pipeline.daemon import serve
from navrl_daemon.rl.training import Training
from navrl_daemon.storage.history import read_results

REPO = Path(__file__).resolve().parents[1]


def bare(cfg: Config, warmup: int, iterations: int) -> dict[str, Any]:
    training = Training.build(cfg, cfg.run.device)
    for _ in range(warmup):
        training.step()
    t0 = time.perf_counter()
    for _ in range(iterations):
        training.step()
    seconds = time.perf_counter() - t0
    return {"frames_per_s": iterations * cfg.frames_per_iteration / seconds, "policy_lag": 0.0}


def daemon(cfg: Config, warmup: int, iterations: int, lag: int) -> dict[str, Any]:
    cfg = cfg.model_copy(deep=True)
    cfg.pipeline.max_policy_lag = lag
    cfg.run.total_frames = (warmup + iterations) * cfg.frames_per_iteration
    stamps: list[float] = []
    lags: list[int] = []
    records: list[IterationRecord] = []

    def observe(record: IterationRecord) -> None:
        stamps.append(time.perf_counter())
        lags.append(record.policy_lag)
        records.append(record)

    with tempfile.TemporaryDirectory() as state:
        anyio.run(serve, cfg, Path(state), observe)
        evaluations = [
            {"iteration": row["iteration"], "seconds": row["seconds"]}
            for row in read_results(Path(state) / "eval" / "results.jsonl")
        ]
    # Frames/s between the last warm-up completion and the last completion.
    seconds = stamps[-1] - stamps[warmup - 1]
    timed = records[warmup:]
    gaps = [b - a for a, b in zip(stamps[warmup - 1 : -1], stamps[warmup:], strict=True)]
    return {
        "frames_per_s": iterations * cfg.frames_per_iteration / seconds,
        "policy_lag": statistics.fmean(lags[warmup:]),
        "collect_s": statistics.median(r.collect_s for r in timed),
        "update_s": statistics.median(r.update_s for r in timed),
        # Seconds between iteration completions in the timed window: the spread in a run.
        "iteration_s": {
            "median": statistics.median(gaps),
            "min": min(gaps),
            "max": max(gaps),
        },
        "evaluations": evaluations,
    }


VARIANTS = ("bare", "daemon_lag0", "daemon_lag1")


def make_config(path: Path, device: str, overrides: list[str]) -> Config:
    return load_config(
        path,
        [
            f"run.device={device}",
            "eval.interval=0",
            "log.level=warning",
            "metrics.enabled=false",
            *overrides,
        ],
        environ={},
    )


def one(
    variant: str, path: Path, device: str, warmup: int, iterations: int, overrides: list[str]
) -> None:
    cfg = make_config(path, device, overrides)
    configure_logging(cfg.log)
    if variant == "bare":
        result = bare(cfg, warmup, iterations)
    else:
        result = daemon(cfg, warmup, iterations, lag=int(variant[-1]))
    print(json.dumps(result))


def alternate(
    script: str,
    variants: Any,
    args: argparse.Namespace,
    *,
    keep_going: bool = False,
    timeout_s: float | None = None,
    after_each: Any = None,
    iterations: dict[str, int] | None = None,
) -> dict[str, list[dict]]:
    """Each variant `args.repeats` times, interleaved, each run a fresh `script --one`
    process (see the module docstring); the JSON each run printed, by variant.

    `keep_going`: a run that fails or outlasts `timeout_s` is recorded as
    `{"error": ...}` (its exit status and the end of its stderr) and the others still run;
    otherwise the first failure raises. `after_each(runs)` is called after every run.
    `iterations`: timed iterations of some variants, instead of `args.iterations`."""
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for _ in range(args.repeats):
        for variant in variants:
            timed = (iterations or {}).get(variant, args.iterations)
            base = [str(args.config), args.device, str(args.warmup), str(timed)]
            cmd = [sys.executable, script, "--one", variant, *base, *args.overrides]
            try:
                done = subprocess.run(
                    cmd, check=True, capture_output=True, text=True, timeout=timeout_s
                )
                runs[variant].append(json.loads(done.stdout.strip().splitlines()[-1]))
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired, ValueError) as err:
                if not keep_going:
                    raise
                runs[variant].append({"error": run_error(err)})
            if after_each is not None:
                after_each(runs)
    return runs


def run_error(err: Exception) -> str:
    """What a failed `--one` run said: how it ended and the last lines of its stderr."""
    if isinstance(err, subprocess.TimeoutExpired):
        head = f"timed out after {err.timeout:.0f} s"
    elif isinstance(err, subprocess.CalledProcessError):
        head = f"exit status {err.returncode}"
    else:
        head = f"no JSON result: {err}"
    stderr = getattr(err, "stderr", None) or ""
    if isinstance(stderr, bytes):
        stderr = stderr.decode(errors="replace")
    tail = "\n".join(stderr.strip().splitlines()[-12:])
    return f"{head}: {tail}" if tail else head


def parse_or_run_one(
    description: str, one: Any, iterations: int, repeats: int = 3
) -> argparse.Namespace | None:
    """The arguments of an alternating daemon benchmark; or, when called as `--one VARIANT
    ...` (a run that `alternate` started), run `one` for it and return None."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config", type=Path, default=REPO / "config" / "default.toml")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=iterations)
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("overrides", nargs="*")
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        variant, path, device, warmup, iters, *overrides = sys.argv[2:]
        one(variant, Path(path), device, int(warmup), int(iters), overrides)
        return None
    return parser.parse_args()


def summary(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 1),
        "min": round(min(values), 1),
        "max": round(max(values), 1),
    }


def main() -> None:
    args = parse_or_run_one(__doc__, one, iterations=12)
    if args is None:
        return
    t0 = time.perf_counter()
    runs = alternate(__file__, VARIANTS, args)
    cfg = make_config(args.config, args.device, args.overrides)
    fps = {k: [r["frames_per_s"] for r in v] for k, v in runs.items()}
    print(
        json.dumps(
            {
                "benchmark": "pipeline_overhead",
                "device": args.device,
                "torch": torch.__version__,
                "torch_threads": torch.get_num_threads(),
                "python": platform.python_version(),
                "num_envs": cfg.env.num_envs,
                "frames_per_iteration": cfg.frames_per_iteration,
                "warmup": args.warmup,
                "iterations": args.iterations,
                "repeats": args.repeats,
                "frames_per_s": {k: summary(v) for k, v in fps.items()},
                "ratio_daemon_lag0_vs_bare": round(
                    statistics.median(fps["daemon_lag0"]) / statistics.median(fps["bare"]), 3
                ),
                "ratio_daemon_lag1_vs_lag0": round(
                    statistics.median(fps["daemon_lag1"]) / statistics.median(fps["daemon_lag0"]),
                    3,
                ),
                "mean_policy_lag": {
                    k: round(statistics.fmean(r["policy_lag"] for r in v), 3)
                    for k, v in runs.items()
                },
                "total_s": round(time.perf_counter() - t0, 1),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
