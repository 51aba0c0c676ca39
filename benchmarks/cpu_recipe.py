"""The daemon end to end at the CPU recipe's shape, with the update's CPU levers and
without them, as JSON.

`config/navrl.toml` at 256 envs × 128 steps (`ppo.update_path=fused ppo.compile=true`,
the shape every CPU learning figure was measured at), the real daemon (`daemon.serve`:
producer, trainer, checkpoint writer; evaluations and metrics off) in a fresh process per
run, the two variants taking turns:
- `before`: `ppo.lidar_conv=native`, the CPU recipe as it ran before the LiDAR CNN's
  matmul lowering;
- `now`: the defaults.
Two layouts: `alone`, one daemon on `--threads-alone` torch threads (2: a 2-core machine
to itself); `side_by_side`, two daemons of the same variant at once on one thread each
(two seeds beside each other). Each run skips `--warmup` iterations (the compilation
among them) and times `--iterations`; frames/s over iteration completions, and frames per
CPU second of the daemon process (steadier on a shared machine). Ratios are `now` over
`before`, of medians over `--repeats` runs.

Run: `.venv/bin/python benchmarks/cpu_recipe.py [--layouts alone side_by_side]`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from navrl_daemon.config import load_config
from navrl_daemon.ops.logging import configure_logging
from navrl_daemon.ops.progress import IterationRecord
from navrl_daemon.pipeline.daemon import configure_heap, serve

REPO = Path(__file__).resolve().parents[1]
SHAPE = [
    "env.num_envs=256",
    "ppo.rollout_length=128",
    "ppo.update_path=fused",
    "ppo.compile=true",
    "eval.interval=0",
    "metrics.enabled=false",
    "log.level=warning",
    "run.startup_timeout_s=0",  # building the 16 maps beside another daemon can take minutes
]
VARIANTS = {
    "before": ["ppo.lidar_conv=native"],
    "now": [],
}


def one(variant: str, threads: int, warmup: int, iterations: int, overrides: list[str]) -> None:
    """One daemon run; prints its JSON result."""
    cfg = load_config(
        REPO / "config" / "navrl.toml",
        [*SHAPE, f"run.torch_threads={threads}", *VARIANTS[variant], *overrides],
        environ={},
    )
    cfg.run.total_frames = (warmup + iterations) * cfg.frames_per_iteration
    configure_logging(cfg.log)
    configure_heap(cfg)
    stamps: list[tuple[float, float]] = []
    records: list[IterationRecord] = []

    def observe(record: IterationRecord) -> None:
        stamps.append((time.perf_counter(), time.process_time()))
        records.append(record)

    with tempfile.TemporaryDirectory() as state:
        anyio.run(serve, cfg, Path(state), observe)
    (wall0, cpu0), (wall1, cpu1) = stamps[warmup - 1], stamps[-1]
    frames = iterations * cfg.frames_per_iteration
    timed = records[warmup:]
    print(
        json.dumps(
            {
                "frames_per_s": frames / (wall1 - wall0),
                "frames_per_cpu_s": frames / (cpu1 - cpu0),
                "collect_s": statistics.median(r.collect_s for r in timed),
                "update_s": statistics.median(r.update_s for r in timed),
            }
        )
    )


def start(variant: str, threads: int, args: argparse.Namespace) -> subprocess.Popen:
    cmd = [
        sys.executable,
        __file__,
        "--one",
        variant,
        str(threads),
        str(args.warmup),
        str(args.iterations),
        *args.overrides,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def finish(proc: subprocess.Popen) -> dict[str, Any]:
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"a daemon run failed ({proc.returncode}):\n{err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        variant, threads, warmup, iterations, *overrides = sys.argv[2:]
        one(variant, int(threads), int(warmup), int(iterations), overrides)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layouts", nargs="+", default=["alone", "side_by_side"])
    parser.add_argument("--threads-alone", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE for both variants")
    args = parser.parse_args()

    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        layout: {v: [] for v in VARIANTS} for layout in args.layouts
    }
    for _ in range(args.repeats):
        for layout in args.layouts:
            for variant in VARIANTS:
                if layout == "alone":
                    runs[layout][variant].append(finish(start(variant, args.threads_alone, args)))
                else:  # both daemons' figures count: each is one seed's speed
                    pair = [start(variant, 1, args) for _ in range(2)]
                    runs[layout][variant].extend(finish(p) for p in pair)
            print(json.dumps(runs), file=sys.stderr, flush=True)  # progress
    results: dict[str, Any] = {}
    for layout, by_variant in runs.items():
        row: dict[str, Any] = {}
        for variant, done in by_variant.items():
            row[variant] = {
                key: spread([r[key] for r in done])
                for key in ("frames_per_s", "frames_per_cpu_s", "collect_s", "update_s")
            }
        for key in ("frames_per_s", "frames_per_cpu_s"):
            row[f"ratio_{key}"] = row["now"][key]["median"] / row["before"][key]["median"]
        results[layout] = row
    doc = {
        "benchmark": "cpu_recipe",
        "shape": SHAPE,
        "variants": VARIANTS,
        "warmup": args.warmup,
        "iterations": args.iterations,
        "repeats": args.repeats,
        "load_average_end": list(os.getloadavg()),
        "results": results,
    }
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
