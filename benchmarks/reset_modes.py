"""Rollout speed and host reads per `env.navigation.reset_mode`: indexed (torchrl's) vs
masked, op by op.

Builds the daemon's Collector (env + acting policy) once per mode from the same config,
warms each up, then times rollouts with the modes taking turns (so drift in the machine's
load hits both), and counts in one rollout per mode the ops that hand a value to the host
(`navrl_daemon/testing/host_reads.py`: on CUDA each one waits for the GPU). Episodes are shortened
with `--episode-lengths` so that resets happen inside the timed rollouts; several lengths
give one result each (NavRL's 2200-step episodes end at about half the steps at 1024
envs once training runs, and the indexed mode does no reset work on the others; an
untrained policy crashes sooner). Prints JSON: per length and mode median [min, max]
rollout seconds, frames/s, resets per rollout, host reads per rollout; masked / indexed
speed.

Run: `.venv/bin/python benchmarks/reset_modes.py [--config config/navrl-original.toml]
[--device cuda] [--repeats 7] [--episode-lengths 50,2200] [KEY=VALUE ...]`
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from machine import device_fields  # benchmarks/machine.py, beside this script

from navrl_daemon.config import load_config
from navrl_daemon.rl.collector import Collector
from navrl_daemon.rl.policy import make_policy
from navrl_daemon.testing.host_reads import CountHostReads

REPO = Path(__file__).resolve().parents[1]

MODES = ("indexed", "masked")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(
    cfg_path: Path, device: torch.device, length: int, repeats: int, overrides: list[str]
) -> dict[str, Any]:
    """Both modes at one episode length: timed rollouts taking turns, then host reads."""
    collectors, buffers = {}, {}
    for mode in MODES:
        cfg = load_config(
            cfg_path,
            [
                f"run.device={device}",
                f"env.max_episode_length={length}",
                *overrides,
                f"env.navigation.reset_mode={mode}",
                "env.collect_path=eager",  # op by op (collect_profile.py times the capture)
            ],
            environ={},
        )
        torch.manual_seed(cfg.run.seed)  # the same initial policy for both
        collectors[mode] = Collector.build(cfg, make_policy(cfg, device), device)
        buffers[mode] = collectors[mode].new_buffer()
        for _ in range(3):  # warm-up: lazy modules, allocator, the first episode ends
            collectors[mode].collect(buffers[mode])
    seconds: dict[str, list[float]] = {m: [] for m in MODES}
    resets: dict[str, list[float]] = {m: [] for m in MODES}
    for _ in range(repeats):
        for mode in MODES:
            sync(device)
            t0 = time.perf_counter()
            collectors[mode].collect(buffers[mode])
            sync(device)
            seconds[mode].append(time.perf_counter() - t0)
            done = buffers[mode]["next", "done"].squeeze(-1)  # [N, T]
            resets[mode].append(float(done.sum()))
    reads = {}
    for mode in MODES:
        with CountHostReads() as counter:
            collectors[mode].collect(buffers[mode])
        sync(device)
        reads[mode] = {"total": counter.count, "by_op": dict(counter.by_op)}
    frames = cfg.env.num_envs * cfg.ppo.rollout_length
    per_mode = {
        mode: {
            "collect_s": {
                "median": round(statistics.median(seconds[mode]), 4),
                "min": round(min(seconds[mode]), 4),
                "max": round(max(seconds[mode]), 4),
            },
            "frames_per_s": round(frames / statistics.median(seconds[mode])),
            "resets_per_rollout": statistics.median(resets[mode]),
            "host_reads_per_rollout": reads[mode],
        }
        for mode in MODES
    }
    ratio = statistics.median(seconds["indexed"]) / statistics.median(seconds["masked"])
    return {
        "max_episode_length": length,
        "modes": per_mode,
        "masked_over_indexed_speed": round(ratio, 3),
        "num_envs": cfg.env.num_envs,
        "num_obstacles": cfg.env.num_obstacles,
        "num_dynamic_obstacles": cfg.env.num_dynamic_obstacles,
        "spawn": cfg.env.navigation.spawn,
        "rollout_length": cfg.ppo.rollout_length,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=REPO / "config" / "navrl-original.toml")
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument(
        "--episode-lengths",
        type=lambda text: [int(x) for x in text.split(",")],
        default=[50],
        help="env.max_episode_length values, comma-separated: one result each",
    )
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    device = torch.device(args.device)
    runs = [
        measure(args.config, device, length, args.repeats, args.overrides)
        for length in args.episode_lengths
    ]
    print(
        json.dumps(
            {
                "benchmark": "reset_modes",
                **device_fields(device),
                "repeats": args.repeats,
                "runs": runs,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
