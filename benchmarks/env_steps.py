"""Env throughput: batched steps/s and frames/s of the embedded NavRL env, printed as JSON.

Measures `step_and_maybe_reset` with uniform random actions in (-2, 2)³ m/s at NavRL's scale
(350 pillars, 80 dynamic obstacles on the 40 m field) against the same env with no obstacles
(the baseline, run in the same process), for several num_envs, on the CPU and on CUDA when
present. Each measurement is repeated; median, min and max are reported.

    python benchmarks/env_steps.py [--num-envs 64 256 1024] [--repeats 3] [--seconds 1.5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch

from navrl_daemon.config import EnvConfig
from navrl_daemon.env import make_env

SCENES = {
    "navrl_obstacles": {"num_obstacles": 350, "num_dynamic_obstacles": 80},
    "no_obstacles": {"num_obstacles": 0, "num_dynamic_obstacles": 0},
}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(scene: str, num_envs: int, device: str, repeats: int, seconds: float) -> dict:
    """Steps/s of one scene: a calibrated number of steps, timed `repeats` times."""
    cfg = EnvConfig(**SCENES[scene])
    t0 = time.perf_counter()
    env = make_env(cfg, device=device, seed=0, num_envs=num_envs)
    build_s = time.perf_counter() - t0
    gen = torch.Generator(device=env.device).manual_seed(0)
    td = env.reset()

    def run(steps: int) -> float:
        nonlocal td
        sync(env.device)
        start = time.perf_counter()
        for _ in range(steps):
            action = torch.rand(num_envs, 1, 3, generator=gen, device=env.device) * 4 - 2
            td.set(("agents", "action"), action)
            _, td = env.step_and_maybe_reset(td)
        sync(env.device)
        return time.perf_counter() - start

    per_step = run(3) / 3  # warm-up, and a first guess of the cost
    per_step = run(5) / 5
    steps = int(min(2000, max(5, seconds / max(per_step, 1e-6))))
    rates = [steps / run(steps) for _ in range(repeats)]
    median = statistics.median(rates)
    return {
        "scene": scene,
        "device": str(env.device),
        "num_envs": num_envs,
        "steps_per_repeat": steps,
        "env_build_s": round(build_s, 3),
        "steps_per_s": {"median": median, "min": min(rates), "max": max(rates)},
        "frames_per_s": {
            "median": median * num_envs,
            "min": min(rates) * num_envs,
            "max": max(rates) * num_envs,
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=1.5, help="target time per repeat")
    parser.add_argument("--devices", nargs="+", default=None, help="default: cpu (+ cuda)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    devices = args.devices or ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    started = time.perf_counter()
    results = [
        measure(scene, n, device, args.repeats, args.seconds)
        for device in devices
        for n in args.num_envs
        for scene in SCENES
    ]
    for r in results:  # cost of the obstacles relative to the empty-world baseline
        base = next(
            b
            for b in results
            if b["scene"] == "no_obstacles"
            and b["device"] == r["device"]
            and b["num_envs"] == r["num_envs"]
        )
        r["vs_no_obstacles"] = r["steps_per_s"]["median"] / base["steps_per_s"]["median"]
    doc = {
        "benchmark": "env_steps",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "action": "uniform (-2, 2)^3 m/s, world frame",
        "repeats": args.repeats,
        "total_s": round(time.perf_counter() - started, 1),
        "results": results,
    }
    json.dump(doc, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
