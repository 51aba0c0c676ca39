"""`pipeline.compress_rollouts`: rollout memory saved vs daemon frames/s lost. JSON out.

The real pipeline (`daemon.serve`), same config, alternating fresh processes:
- `raw_lag0_pool1`: on-policy, one rollout buffer (least memory, no overlap);
- `raw_lag1_pool2`: collection of rollout i+1 overlaps training on i: two raw buffers;
- `compressed_lag1_pool1`: the same overlap with one raw buffer, training on an LZ4 copy
  of the batch in env-group minibatches (storage/compressed_rollout.py).
Frames/s as in benchmarks/storage_cost.py (last warm-up iteration to the last one).

Memory, measured in this process on a rollout of the same config (random-init policy):
`buffer_bytes` (one preallocated rollout buffer, every key), `batch_bytes` (what the
update trains on: observations, actions, log-probs, values, advantages, targets) and
`stored_bytes` (that batch compressed); `rollout_memory_bytes` per variant = buffers x
buffer_bytes (+ stored_bytes + one decoded minibatch when compressed). `peak_rss_mb` is
each run's process peak (everything, so only differences mean anything).

Run: `.venv/bin/python benchmarks/compressed_rollouts.py [--repeats 3] [KEY=VALUE ...]`
"""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import time
from pathlib import Path

import torch
from pipeline_overhead import alternate, daemon, make_config, parse_or_run_one, summary

from navrl_daemon.ops.logging import configure_logging
from navrl_daemon.rl import ppo
from navrl_daemon.rl.learner import Learner
from navrl_daemon.rl.training import Training
from navrl_daemon.storage.compressed_rollout import CompressedMinibatches

VARIANTS = {
    "raw_lag0_pool1": ["pipeline.max_policy_lag=0", "pipeline.lease_pool=1"],
    "raw_lag1_pool2": ["pipeline.max_policy_lag=1", "pipeline.lease_pool=2"],
    "compressed_lag1_pool1": [
        "pipeline.max_policy_lag=1",
        "pipeline.lease_pool=1",
        "pipeline.compress_rollouts=true",
    ],
}
BASE = ["checkpoint.interval=0", "archive.interval=0"]


def one(variant: str, path: Path, device: str, warmup: int, iterations: int, extra: list[str]):
    cfg = make_config(path, device, [*BASE, *extra, *VARIANTS[variant]])
    configure_logging(cfg.log)
    result = daemon(cfg, warmup, iterations, lag=cfg.pipeline.max_policy_lag)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


def memory(path: Path, device: str, extra: list[str], rollouts: int) -> dict[str, float]:
    """Sizes on real rollouts of this config (median over `rollouts`), and the update
    time on the same batch: NavRL's frame minibatches, env groups, env groups compressed."""
    cfg = make_config(path, device, [*BASE, *extra])
    training = Training.build(cfg, device)
    source = CompressedMinibatches(cfg.pipeline.compress_workers)
    stored, batch, times = [], [], {"frames": [], "env_groups": [], "compressed": []}
    sources = {
        "frames": ppo.frame_minibatches,
        "env_groups": ppo.env_minibatches,
        "compressed": source,
    }
    learners = {
        name: Learner.build(cfg, training.policy, device, minibatches=minibatches)
        for name, minibatches in sources.items()
    }
    for _ in range(rollouts):
        training.collector.collect(training.buffer)
        for name, learner in learners.items():
            t0 = time.perf_counter()
            learner.update(training.buffer)
            times[name].append(time.perf_counter() - t0)
        stored.append(source.stats.stored_bytes)
        batch.append(source.stats.raw_bytes)
    minibatch = statistics.median(batch) / cfg.ppo.minibatches
    return {
        "buffer_bytes": training.buffer.bytes(),
        "batch_bytes": statistics.median(batch),
        "stored_bytes": statistics.median(stored),
        "stored_over_batch": statistics.median(stored) / statistics.median(batch),
        "decoded_minibatch_bytes": minibatch,
        "update_ms": {k: summary([1e3 * x for x in v]) for k, v in times.items()},
        "update_ratio_compressed_vs_frames": statistics.median(times["compressed"])
        / statistics.median(times["frames"]),
    }


def main() -> None:
    args = parse_or_run_one(__doc__, one, iterations=12)
    if args is None:
        return
    t0 = time.perf_counter()
    runs = alternate(__file__, VARIANTS, args)
    fps = {k: [r["frames_per_s"] for r in v] for k, v in runs.items()}
    base = statistics.median(fps["raw_lag1_pool2"])
    cfg = make_config(args.config, args.device, [*BASE, *args.overrides])
    sizes = memory(args.config, args.device, args.overrides, rollouts=5)
    buffer = sizes["buffer_bytes"]
    compressed_extra = sizes["stored_bytes"] + sizes["decoded_minibatch_bytes"]
    print(
        json.dumps(
            {
                "benchmark": "compressed_rollouts",
                "device": args.device,
                "cores": os.cpu_count(),
                "load_average_1min_end": os.getloadavg()[0],
                "torch": torch.__version__,
                "python": platform.python_version(),
                "num_envs": cfg.env.num_envs,
                "num_obstacles": cfg.env.num_obstacles,
                "frames_per_iteration": cfg.frames_per_iteration,
                "iterations": args.iterations,
                "repeats": args.repeats,
                "frames_per_s": {k: summary(v) for k, v in fps.items()},
                "ratio_vs_raw_lag1_pool2": {
                    k: round(statistics.median(v) / base, 3) for k, v in fps.items()
                },
                "peak_rss_mb": {k: summary([r["peak_rss_mb"] for r in v]) for k, v in runs.items()},
                "sizes": sizes,
                "rollout_memory_bytes": {
                    "raw_lag0_pool1": buffer,
                    "raw_lag1_pool2": 2 * buffer,
                    "compressed_lag1_pool1": buffer + compressed_extra,
                },
                "total_s": round(time.perf_counter() - t0, 1),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
