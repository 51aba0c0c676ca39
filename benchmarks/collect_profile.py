"""Where a rollout's time goes: collect s/iter, host syncs per env step, and the top ops.

Builds the daemon's Collector (env + acting policy) from a config, warms it up, then:
- times `--repeats` rollouts (median and spread, s and frames/s);
- on CUDA, counts the host syncs of one rollout with `torch.cuda.set_sync_debug_mode`
  (each blocking call warns once per call site visit): issue #8 asks for none per step;
- profiles one rollout with torch.profiler and prints the top ops by self time.
Prints the JSON summary last; `--table FILE` also writes the profiler table there.

Run: `.venv/bin/python benchmarks/collect_profile.py [--config config/navrl.toml]
[--device cuda] [KEY=VALUE ...]`
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from collections import Counter
from pathlib import Path

import torch
from tensordict import TensorDictBase
from torch.profiler import ProfilerActivity, profile

from navrl_daemon.config import load_config
from navrl_daemon.rl.training import Collector, make_policy

REPO = Path(__file__).resolve().parents[1]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def count_syncs(
    collector: Collector, buffer: TensorDictBase, device: torch.device
) -> dict[str, object]:
    """Blocking host syncs in one rollout, by the line of our code that made them."""
    if device.type != "cuda":
        return {"syncs": None, "why": "host syncs are only counted on CUDA"}
    sites: Counter[str] = Counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            collector.collect(buffer)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    for w in caught:
        sites[f"{Path(w.filename).name}:{w.lineno}"] += 1
    return {"syncs": sum(sites.values()), "by_site": dict(sites.most_common(15))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=REPO / "config" / "default.toml")
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--table", type=Path, help="write the profiler's op table here")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    cfg = load_config(args.config, [f"run.device={args.device}", *args.overrides], environ={})
    device = torch.device(args.device)
    torch.manual_seed(cfg.run.seed)
    t0 = time.perf_counter()
    collector = Collector.build(cfg, make_policy(cfg, device), device)
    buffer = collector.new_buffer()
    build_s = time.perf_counter() - t0
    for _ in range(2):
        collector.collect(buffer)
    seconds = []
    for _ in range(args.repeats):
        sync(device)
        t0 = time.perf_counter()
        collector.collect(buffer)
        sync(device)
        seconds.append(time.perf_counter() - t0)
    syncs = count_syncs(collector, buffer, device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        collector.collect(buffer)
        sync(device)
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort, row_limit=30)
    if args.table:
        args.table.write_text(table)
    else:
        print(table)
    frames = cfg.env.num_envs * cfg.ppo.rollout_length
    steps = cfg.ppo.rollout_length
    print(
        json.dumps(
            {
                "benchmark": "collect_profile",
                "device": str(device),
                "device_name": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                "num_envs": cfg.env.num_envs,
                "num_obstacles": cfg.env.num_obstacles,
                "num_dynamic_obstacles": cfg.env.num_dynamic_obstacles,
                "rollout_length": steps,
                "build_s": round(build_s, 2),
                "collect_s": {
                    "median": statistics.median(seconds),
                    "min": min(seconds),
                    "max": max(seconds),
                },
                "frames_per_s": round(frames / statistics.median(seconds)),
                "ms_per_env_step": round(1000 * statistics.median(seconds) / steps, 3),
                "host_syncs_per_rollout": syncs,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
