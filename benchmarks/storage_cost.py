"""What archiving and checkpointing cost the training loop: daemon frames/s, as JSON.

The real pipeline (`daemon.serve`), same config, alternating fresh processes:
- `baseline`: no archive, checkpoints only at the end (`checkpoint.interval = 0`);
- `archive_every`: every rollout archived (`archive.interval = 1`, default codec);
- `checkpoint_every`: a checkpoint after every iteration (`checkpoint.interval = 1`).
Ratios are medians over `--repeats` runs of frames/s against `baseline` (goal for the
archive: ≥ 0.95). Frames/s is measured from the last warm-up iteration to the last one,
so the end-of-run flush is not in it.

Run: `.venv/bin/python benchmarks/storage_cost.py [--repeats 5] [--device cuda]`
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
from pipeline_overhead import alternate, daemon, make_config, parse_or_run_one, summary

from navrl_daemon.ops.logging import configure_logging

VARIANTS = {
    "baseline": ["checkpoint.interval=0", "archive.interval=0"],
    "archive_every": ["checkpoint.interval=0", "archive.interval=1"],
    "checkpoint_every": ["checkpoint.interval=1", "archive.interval=0"],
}


def one(variant: str, path: Path, device: str, warmup: int, iterations: int, extra: list[str]):
    cfg = make_config(path, device, [*extra, *VARIANTS[variant]])
    configure_logging(cfg.log)
    print(json.dumps(daemon(cfg, warmup, iterations, lag=cfg.pipeline.max_policy_lag)))


def main() -> None:
    args = parse_or_run_one(__doc__, one, iterations=15, repeats=5)
    if args is None:
        return
    t0 = time.perf_counter()
    runs = alternate(__file__, VARIANTS, args)
    fps = {k: [r["frames_per_s"] for r in v] for k, v in runs.items()}
    base_fps = statistics.median(fps["baseline"])
    cfg = make_config(args.config, args.device, args.overrides)
    print(
        json.dumps(
            {
                "benchmark": "storage_cost",
                "device": args.device,
                "cores": os.cpu_count(),
                "torch": torch.__version__,
                "python": platform.python_version(),
                "num_envs": cfg.env.num_envs,
                "frames_per_iteration": cfg.frames_per_iteration,
                "iterations": args.iterations,
                "repeats": args.repeats,
                "frames_per_s": {k: summary(v) for k, v in fps.items()},
                "ratio_vs_baseline": {
                    k: round(statistics.median(v) / base_fps, 3) for k, v in fps.items()
                },
                "total_s": round(time.perf_counter() - t0, 1),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
