"""Frames/s of `navrl-daemon run` as 1 process vs N torchrun ranks, same total envs (JSON).

Both variants train the same global batch: `single` one process with E envs, `ranks` N
processes with E / N envs each (their minibatches together are the single process's). Each
run is the real CLI on `--config` for `--iterations` iterations (evaluation off, one final
checkpoint), in a fresh state dir; frames/s is the median of the history rows after the
first (so start-up and the final flush are not in it). Variants alternate, `--repeats`
times; the result is the median (min, max) of each and the ratio of medians.

On a CPU, each rank gets `cores / N` torch threads and the single process all of them, so
the comparison is one team of threads against N processes on the same cores; with GPUs,
each rank gets its own device.

Run: `.venv/bin/python benchmarks/distributed_scaling.py [--nproc 2] [--repeats 3]`
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from pipeline_overhead import REPO, summary


def run_once(
    variant: str, args: argparse.Namespace, state: Path, total_envs: int, rollout: int
) -> dict:
    nproc = args.nproc if variant == "ranks" else 1
    envs = total_envs // nproc
    threads = max(1, (os.cpu_count() or 1) // nproc) if args.device == "cpu" else 0
    frames = args.iterations * total_envs * rollout
    overrides = [
        f"env.num_envs={envs}",
        f"run.total_frames={frames}",
        f"run.device={args.device}",
        f"run.torch_threads={threads}",
        "eval.interval=0",
        "checkpoint.interval=0",
        "metrics.port=0",
        "log.format=json",
        f"log.summary_interval={args.summary}",
        *args.overrides,
    ]
    cli = ["-m", "navrl_daemon", "run", "--config", str(args.config), "--state-dir", str(state)]
    if nproc == 1:
        cmd = [sys.executable, *cli, *overrides]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
        cmd += [f"--master-port={args.port}", *cli, *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads or 1)}
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    rows = [json.loads(x) for x in (state / "history.jsonl").read_text().splitlines()]
    fps = [r["frames_per_second"] for r in rows if "frames_per_second" in r][1:]
    return {"frames_per_second": statistics.median(fps), "rows": len(fps), "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", type=Path, default=REPO / "config" / "default.toml")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--summary", type=int, default=5, help="iterations per history row")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--port", type=int, default=29533)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    from navrl_daemon.config import load_config

    cfg = load_config(args.config, args.overrides, environ={})
    total_envs, rollout = cfg.env.num_envs, cfg.ppo.rollout_length
    if total_envs % args.nproc:
        parser.error(f"env.num_envs = {total_envs} does not split over {args.nproc} ranks")
    t0 = time.perf_counter()
    runs: dict[str, list[dict]] = {"single": [], "ranks": []}
    with tempfile.TemporaryDirectory(prefix="navrl-scaling-") as tmp:
        for repeat in range(args.repeats):
            for variant in runs:
                state = Path(tmp) / f"{variant}-{repeat}"
                runs[variant].append(run_once(variant, args, state, total_envs, rollout))
    fps = {v: [r["frames_per_second"] for r in rs] for v, rs in runs.items()}
    result = {
        "benchmark": "distributed_scaling",
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "device": args.device,
            "torch": torch.__version__,
            "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
        },
        "config": str(args.config),
        "overrides": args.overrides,
        "total_envs": total_envs,
        "nproc": args.nproc,
        "iterations": args.iterations,
        "repeats": args.repeats,
        "frames_per_second": {v: summary(f) for v, f in fps.items()},
        "ratio_ranks_over_single": round(
            statistics.median(fps["ranks"]) / statistics.median(fps["single"]), 3
        ),
        "runs": runs,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
