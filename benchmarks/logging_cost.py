"""What W&B and evaluation videos cost the training loop: daemon frames/s, as JSON.

The real pipeline (`daemon.serve`), same config, evaluated every `eval.interval = 5`
iterations, alternating fresh processes:
- `off`: TensorBoard only (the default);
- `wandb`: W&B too, offline (`log.wandb = true`, `log.wandb_mode = "offline"`): the same
  scalars, the config, the final policy as an artifact;
- `wandb_videos`: W&B and a video of every evaluation (`log.video_interval = 1`, the
  worst case), to TensorBoard and W&B.
Ratios are medians over `--repeats` runs of frames/s against `off`. Frames/s is measured
from the last warm-up iteration to the last one, so neither W&B's start (~1 s) nor its
finish is in it.

Run: `.venv/bin/python benchmarks/logging_cost.py [--repeats 3] [--iterations 20]`
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
from pipeline_overhead import alternate, daemon, make_config, parse_or_run_one, summary

from navrl_daemon.ops.logging import configure_logging

COMMON = ["eval.interval=5", "checkpoint.interval=0"]
WANDB = ["log.wandb=true", "log.wandb_mode=offline"]
VARIANTS = {
    "off": ["log.wandb=false", "log.video_interval=0"],
    "wandb": [*WANDB, "log.video_interval=0"],
    "wandb_videos": [*WANDB, "log.video_interval=1"],
}


def one(variant: str, path: Path, device: str, warmup: int, iterations: int, extra: list[str]):
    cfg = make_config(path, device, [*COMMON, *extra, *VARIANTS[variant]])
    configure_logging(cfg.log)
    result = daemon(cfg, warmup, iterations, lag=cfg.pipeline.max_policy_lag)
    result["evaluation_s"] = [e["seconds"] for e in result.pop("evaluations")]
    print(json.dumps(result))


def main() -> None:
    args = parse_or_run_one(__doc__, one, iterations=20, repeats=3)
    if args is None:
        return
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as home:  # W&B's caches, not the user's
        os.environ.update(
            WANDB_SILENT="true",
            WANDB_CONFIG_DIR=f"{home}/config",
            WANDB_CACHE_DIR=f"{home}/cache",
            WANDB_DATA_DIR=f"{home}/data",
        )
        runs = alternate(__file__, VARIANTS, args)
    fps = {k: [r["frames_per_s"] for r in v] for k, v in runs.items()}
    off = statistics.median(fps["off"])
    cfg = make_config(args.config, args.device, [*COMMON, *args.overrides])
    print(
        json.dumps(
            {
                "benchmark": "logging_cost",
                "device": args.device,
                "cores": os.cpu_count(),
                "load_average": [round(x, 2) for x in os.getloadavg()],
                "torch": torch.__version__,
                "python": platform.python_version(),
                "num_envs": cfg.env.num_envs,
                "frames_per_iteration": cfg.frames_per_iteration,
                "eval_interval": cfg.eval.interval,
                "warmup": args.warmup,
                "iterations": args.iterations,
                "repeats": args.repeats,
                "frames_per_s": {k: summary(v) for k, v in fps.items()},
                "ratio_vs_off": {k: round(statistics.median(v) / off, 3) for k, v in fps.items()},
                "evaluations_per_run": {
                    k: statistics.median(len(r["evaluation_s"]) for r in v) for k, v in runs.items()
                },
                "total_s": round(time.perf_counter() - t0, 1),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
