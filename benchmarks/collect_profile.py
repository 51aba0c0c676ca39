"""Where a rollout's time goes, per collection path: s/rollout, host syncs, GPU busy, top ops.

Builds the daemon's Collector (env + acting policy) from a config once per path:
- `eager_indexed`: rollout steps op by op, torchrl's indexed reset (what `auto` runs
  without capture);
- `eager_masked`: op by op, the masked reset (no host sync);
- `cuda_graph`: each step after the warm-up a CUDA graph replay (masked reset; CUDA only).
Each is warmed up (the capture happens there), then rollouts are timed with the paths
taking turns (median and spread, s and frames/s); on CUDA the host syncs of one rollout
are counted by call site (`torch.cuda.set_sync_debug_mode`), and one rollout per path is
profiled (torch.profiler): the GPU's own time in it (self CUDA time), so its busy share,
and the top ops. The masked over indexed speed without capture is what `env.navigation.reset_mode =
"auto"` decides on; captured over eager-indexed is what `env.collect_path = "auto"` gains.
Prints the JSON summary last; `--table FILE` also writes the profiler tables there.

Run: `.venv/bin/python benchmarks/collect_profile.py [--config config/navrl-original.toml]
[--device cuda] [--paths eager_indexed,eager_masked,cuda_graph] [KEY=VALUE ...]`
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from machine import device_fields  # benchmarks/machine.py, beside this script
from tensordict import TensorDictBase
from torch.profiler import ProfilerActivity, profile

from navrl_daemon.config import load_config
from navrl_daemon.env.contract import CapturableEnv
from navrl_daemon.rl.collector import Collector
from navrl_daemon.rl.policy import make_policy
from navrl_daemon.testing.host_reads import CountHostReads

REPO = Path(__file__).resolve().parents[1]

PATHS = {
    "eager_indexed": ["env.collect_path=eager", "env.navigation.reset_mode=indexed"],
    "eager_masked": ["env.collect_path=eager", "env.navigation.reset_mode=masked"],
    "cuda_graph": ["env.collect_path=cuda_graph", "env.navigation.reset_mode=auto"],
}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def masked_reset(env: object) -> bool:
    """Whether the env resets with masks (a capturable backend's choice)."""
    return isinstance(env, CapturableEnv) and env.masked_reset


def count_syncs(
    collector: Collector, buffer: TensorDictBase, device: torch.device
) -> dict[str, object]:
    """Blocking host syncs in one rollout, by the line of our code that made them."""
    if device.type != "cuda":
        with CountHostReads() as reads:
            collector.collect(buffer)
        return {"host_reads": reads.count, "by_op": dict(reads.by_op)}
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


def profiled(
    collector: Collector, buffer: TensorDictBase, device: torch.device
) -> tuple[dict[str, Any], str]:
    """One rollout under torch.profiler: (GPU and CPU self time in ms, the op table)."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        collector.collect(buffer)
        sync(device)
    wall = time.perf_counter() - t0
    events = prof.key_averages()
    gpu_us = sum(getattr(e, "self_device_time_total", 0.0) for e in events)
    cpu_us = sum(e.self_cpu_time_total for e in events)
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    times = {
        "wall_ms": round(1000 * wall, 2),
        "self_gpu_ms": round(gpu_us / 1000, 2),
        "self_cpu_ms": round(cpu_us / 1000, 2),
        "gpu_busy_share": round(gpu_us / 1e6 / wall, 3) if device.type == "cuda" else None,
    }
    return times, events.table(sort_by=sort, row_limit=25)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=REPO / "config" / "default.toml")
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--paths", default=None, help="comma-separated; default: all that can run")
    p.add_argument("--table", type=Path, help="write the profiler's op tables here")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    device = torch.device(args.device)
    names = (
        args.paths.split(",")
        if args.paths
        else [n for n in PATHS if device.type == "cuda" or n != "cuda_graph"]
    )
    collectors: dict[str, tuple[Collector, TensorDictBase]] = {}
    out_paths: dict[str, dict[str, Any]] = {}
    cfg = None
    for name in names:
        try:
            cfg = load_config(
                args.config,
                [f"run.device={args.device}", *args.overrides, *PATHS[name]],
                environ={},
            )
            torch.manual_seed(cfg.run.seed)  # the same policy for every path
            t0 = time.perf_counter()
            collector = Collector.build(cfg, make_policy(cfg, device), device)
            buffer = collector.new_buffer()
            build_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            for _ in range(3):  # warm-up: lazy init, the capture, the first episodes
                collector.collect(buffer)
            sync(device)
            collectors[name] = (collector, buffer)
            out_paths[name] = {
                "build_s": round(build_s, 2),
                "warmup_s": round(time.perf_counter() - t0, 2),
                "reset": "masked" if masked_reset(collector.env) else "indexed",
                "capture_error": collector.capture_error,
            }
        except Exception as err:  # a path that fails is reported; the others still run
            out_paths[name] = {
                "error": f"{type(err).__name__}: {err}",
                "trace": traceback.format_exc(limit=4),
            }
    seconds: dict[str, list[float]] = {n: [] for n in collectors}
    for _ in range(args.repeats):
        for name, (collector, buffer) in collectors.items():
            sync(device)
            t0 = time.perf_counter()
            collector.collect(buffer)
            sync(device)
            seconds[name].append(time.perf_counter() - t0)
    tables = []
    assert cfg is not None
    frames = cfg.env.num_envs * cfg.ppo.rollout_length
    steps = cfg.ppo.rollout_length
    for name, (collector, buffer) in collectors.items():
        try:
            times, table = profiled(collector, buffer, device)
            tables.append(f"== {name}\n{table}")
            syncs = count_syncs(collector, buffer, device)
        except Exception as err:
            times, syncs = {"error": f"{type(err).__name__}: {err}"}, {}
        median = statistics.median(seconds[name])
        out_paths[name].update(
            {
                "collect_s": {
                    "median": round(median, 5),
                    "min": round(min(seconds[name]), 5),
                    "max": round(max(seconds[name]), 5),
                },
                "frames_per_s": round(frames / median),
                "ms_per_env_step": round(1000 * median / steps, 3),
                "profiled_rollout": times,
                "host_syncs_per_rollout": syncs,
            }
        )
    if args.table:
        args.table.write_text("\n\n".join(tables))
    fps = {n: v["frames_per_s"] for n, v in out_paths.items() if "frames_per_s" in v}
    ratios = {}
    if "eager_masked" in fps and "eager_indexed" in fps:
        ratios["eager_masked_vs_eager_indexed"] = round(
            fps["eager_masked"] / fps["eager_indexed"], 3
        )
    if "cuda_graph" in fps:
        for base in ("eager_indexed", "eager_masked"):
            if base in fps:
                ratios[f"cuda_graph_vs_{base}"] = round(fps["cuda_graph"] / fps[base], 3)
    print(
        json.dumps(
            {
                "benchmark": "collect_profile",
                **device_fields(device),
                "config": str(args.config),
                "overrides": args.overrides,
                "num_envs": cfg.env.num_envs,
                "num_obstacles": cfg.env.num_obstacles,
                "num_dynamic_obstacles": cfg.env.num_dynamic_obstacles,
                "rollout_length": steps,
                "repeats": args.repeats,
                "paths": out_paths,
                "ratios": ratios,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
