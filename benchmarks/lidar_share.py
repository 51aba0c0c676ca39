"""The LiDAR's share of a rollout step, as JSON (issue #22): is the cast worth making cheaper?

Per `--num-envs`: the daemon's Collector on the config (on CUDA with the captured step,
`env.collect_path=cuda_graph`, masked reset), warmed up; then, timed on the device
(CUDA events, or the host clock on a CPU) with the two taking turns:
- a rollout step: ms per env step over whole rollouts (policy + env + masked reset);
- one LiDAR cast of every drone (`Lidar.distances` at their poses), as a captured graph
  on CUDA, op by op on a CPU.
A masked-reset step casts twice (the step's scan and the fresh episodes' one), so the
share is 2 × cast / step. Also: the culling grid's candidate boxes per cell (K: each ray
is tested against K boxes) against the boxes of a whole map (what brute force tests).

Run: `.venv/bin/python benchmarks/lidar_share.py --device cuda --config config/navrl-original.toml
--num-envs 1024 4096`
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from machine import device_fields  # benchmarks/machine.py, beside this script

from navrl_daemon.config import load_config
from navrl_daemon.rl.collector import Collector
from navrl_daemon.rl.graphs import capture_graph
from navrl_daemon.rl.policy import make_policy

REPO = Path(__file__).resolve().parents[1]


def timed(fn: Callable[[], None], device: torch.device, times: int) -> float:
    """Seconds per call of `fn`, `times` calls in a row, timed on the device."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(times):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000 / times
    t0 = time.perf_counter()
    for _ in range(times):
        fn()
    return (time.perf_counter() - t0) / times


def measure(args: argparse.Namespace, num_envs: int) -> dict[str, object]:
    device = torch.device(args.device)
    path = "cuda_graph" if device.type == "cuda" else "eager"
    cfg = load_config(
        args.config,
        [
            f"run.device={args.device}",
            f"env.num_envs={num_envs}",
            f"env.collect_path={path}",
            "env.navigation.reset_mode=masked",
            *args.overrides,
        ],
        environ={},
    )
    torch.manual_seed(cfg.run.seed)
    collector = Collector.build(cfg, make_policy(cfg, device), device)
    buffer = collector.new_buffer()
    for _ in range(3):
        collector.collect(buffer)
    env = collector.env
    lidar = env.lidar  # type: ignore[attr-defined]
    scan = torch.empty_like(env.scan)  # type: ignore[attr-defined]

    def cast() -> None:
        scan.copy_(lidar.distances(env.pos, env.yaw, env.map_id))  # type: ignore[attr-defined]

    if device.type == "cuda":
        cast = capture_graph(cast, lambda: None, cast, device)
    steps = cfg.ppo.rollout_length
    step_s, cast_s = [], []
    for _ in range(args.repeats):
        step_s.append(timed(lambda: collector.collect(buffer), device, 1) / steps)
        cast_s.append(timed(cast, device, steps))
    step, one_cast = statistics.median(step_s), statistics.median(cast_s)
    grid = lidar.grid
    return {
        "num_envs": num_envs,
        "collect_path": path,
        "capture_error": collector.capture_error,
        "step_ms": {
            "median": round(1000 * step, 4),
            "min": round(1000 * min(step_s), 4),
            "max": round(1000 * max(step_s), 4),
        },
        "cast_ms": {
            "median": round(1000 * one_cast, 4),
            "min": round(1000 * min(cast_s), 4),
            "max": round(1000 * max(cast_s), 4),
        },
        "casts_per_step": 2,
        "lidar_share": round(2 * one_cast / step, 3),
        "candidates_per_cell": grid.candidates_per_cell,
        "boxes_per_map": int(grid.boxes.shape[1] - 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=REPO / "config" / "default.toml")
    p.add_argument("--device", default="cpu")
    p.add_argument("--num-envs", type=int, nargs="+", default=[64])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, help="also rewrite the JSON here after every size")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    device = torch.device(args.device)
    runs: list[dict[str, object]] = []

    def report() -> str:
        return json.dumps(
            {
                "benchmark": "lidar_share",
                **device_fields(device),
                "config": str(args.config),
                "overrides": args.overrides,
                "repeats": args.repeats,
                "runs": runs,
            },
            indent=1,
        )

    for n in args.num_envs:
        try:
            runs.append(measure(args, n))
        except Exception as err:  # one size failing keeps the others' numbers
            runs.append({"num_envs": n, "error": f"{type(err).__name__}: {err}"})
        if args.out:
            args.out.write_text(report())
    print(report())


if __name__ == "__main__":
    main()
