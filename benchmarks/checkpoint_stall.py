"""Checkpoint cost to training vs a synchronous save, and what each LZ4 level buys. JSON out.

Two states:
- `navrl`: the real snapshot of a NavRL-scale run (config/navrl-original.toml on this device): the
  learner (NavRL's policy with ValueNorm, three Adams, RNG) and the collector (env state of
  1024 drones, the running TensorDict, process RNGs);
- `synthetic_200mb`: 200 MB of float32 tensors in 50 parameters, with Adam-like moments.

What the training loop waits for per checkpoint in the daemon: the trainer *starts* the
learner's host copies (stages/trainer.py, storage/staging.py; on the CPU they run on a
copier thread) and the producer captures the collector's state (stages/producer.py); the
trainer's next update waits at `staging.fence()` for copies still running. So the stall is
launch + capture + fence wait, and depends on what happens before the next update:
- `after_rollout`: one real rollout collection of the NavRL config (1024 drones x 32
  steps) runs between snapshot and fence: the default pipeline (`max_policy_lag = 0`),
  where the next update needs the next rollout. `collect_s` gives that collection's time
  with a copy running beside it and without (the cost that moves off the trainer);
- `back_to_back`: the fence right after the launch: the worst case (`max_policy_lag = 1`
  with the next rollout already waiting), i.e. launch + the whole copy.
- `sync_s`: the baseline a training script does inline: `torch.save` of the same state,
  LZ4 (fast) of the bytes, write, fsync.
`stall_over_sync` = median stall after a rollout / median sync (goal <= 0.01);
`stall_over_sync_back_to_back` the same for the worst case.

Per LZ4 level (0 = fast, 3..16 = HC) and writer threads: stored/raw, encode MB/s (raw bytes
per second of `encode_checkpoint`) and write MB/s (encode + durable write).

Run: `.venv/bin/python benchmarks/checkpoint_stall.py [--repeats 9] [--device cuda]`
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import lz4.frame
import torch

from navrl_daemon.config import load_config
from navrl_daemon.rl.training import Training
from navrl_daemon.storage.checkpoint import CheckpointDir, encode_checkpoint
from navrl_daemon.storage.staging import SnapshotStaging

REPO = Path(__file__).resolve().parents[1]


def summary(xs: list[float]) -> dict[str, float]:
    ordered = sorted(xs)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {
        "median": statistics.median(xs),
        "p50": statistics.median(xs),
        "p99": p99,
        "min": ordered[0],
        "max": ordered[-1],
    }


def sync_save(state: dict[str, Any], path: Path) -> None:
    buf = io.BytesIO()
    torch.save(state, buf)
    data = lz4.frame.compress(buf.getbuffer())
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def navrl_training(device: str) -> Training:
    cfg = load_config(REPO / "config" / "navrl-original.toml", [f"run.device={device}"], environ={})
    training = Training.build(cfg, device)
    training.step()  # Adam moments exist after the first update
    return training


def synthetic_state(mb: int, device: str) -> dict[str, Any]:
    n = mb * (1 << 20) // 4 // 3 // 50  # params + two Adam moments = mb
    g = torch.Generator().manual_seed(0)
    params = {f"layer{i}.weight": torch.randn(n, generator=g).to(device) for i in range(50)}
    moments = {
        i: {"exp_avg": torch.randn(n, generator=g).to(device) * 1e-3, "step": torch.tensor(9.0)}
        for i in range(50)
    }
    for i in range(50):
        moments[i]["exp_avg_sq"] = moments[i]["exp_avg"].square()
    return {"policy": params, "optimizer": {"state": moments}, "version": 9}


def measure(
    name: str, capture: Any, full_state: Any, repeats: int, tmp: Path, collect: Any
) -> dict:
    staging = SnapshotStaging(4)
    stalls: dict[str, list[float]] = {"after_rollout": [], "back_to_back": []}
    launches, syncs, collect_with, collect_without = [], [], [], []
    for r in range(repeats + 1):  # the first round allocates the staging buffers
        for case, gap in (("back_to_back", None), ("after_rollout", collect)):
            t0 = time.perf_counter()
            staged = capture(staging)
            launch = time.perf_counter() - t0
            if gap is not None:
                t1 = time.perf_counter()
                gap()
                collected = time.perf_counter() - t1
            t1 = time.perf_counter()
            staging.fence()  # the trainer's next update
            waited = time.perf_counter() - t1
            staged.ready()
            staged.release()
            if r:
                stalls[case].append(launch + waited)
                if gap is not None:
                    launches.append(launch)
                    collect_with.append(collected)
        t1 = time.perf_counter()
        collect()
        without = time.perf_counter() - t1
        t0 = time.perf_counter()
        sync_save(full_state(), tmp / f"sync-{r}.bin")
        sync = time.perf_counter() - t0
        if r:
            syncs.append(sync)
            collect_without.append(without)
    staged = capture(staging)
    staged.ready()
    state = staged.state
    levels = []
    for level in (0, 3, 9, 16):
        for workers in (1, 2):
            pool = ThreadPoolExecutor(workers)
            enc, wr, sizes = [], [], None
            for _ in range(max(3, repeats // 3)):
                t0 = time.perf_counter()
                data = encode_checkpoint(
                    state, iteration=1, frames=1, policy_version=1, level=level, executor=pool
                )
                t1 = time.perf_counter()
                CheckpointDir(tmp / "ckpts").write(data, 1)
                t2 = time.perf_counter()
                enc.append(t1 - t0)
                wr.append(t2 - t0)
                head = json.loads(data[8 : 8 + int.from_bytes(data[4:8], "little")])
                sizes = (head["raw_bytes"], head["stored_bytes"])
            pool.shutdown()
            raw, stored = sizes
            levels.append(
                {
                    "level": level,
                    "workers": workers,
                    "raw_bytes": raw,
                    "stored_bytes": stored,
                    "stored_over_raw": stored / raw,
                    "encode_mb_per_s": raw / statistics.median(enc) / 1e6,
                    "write_mb_per_s": raw / statistics.median(wr) / 1e6,
                    "write_s": summary(wr),
                }
            )
    staged.release()
    sync = statistics.median(syncs)
    return {
        "state": name,
        "raw_bytes": levels[0]["raw_bytes"],
        "stall_s": {case: summary(xs) for case, xs in stalls.items()},
        "launch_s": summary(launches),
        "sync_s": summary(syncs),
        "stall_over_sync": statistics.median(stalls["after_rollout"]) / sync,
        "stall_over_sync_back_to_back": statistics.median(stalls["back_to_back"]) / sync,
        "collect_s": {"copy_running": summary(collect_with), "alone": summary(collect_without)},
        "levels": levels,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--synthetic-mb", type=int, default=200)
    args = ap.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    results = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        training = navrl_training(args.device)
        learner, collector = training.learner, training.collector

        def rollout() -> None:
            collector.collect(training.buffer)
            if args.device == "cuda":
                torch.cuda.synchronize()

        def navrl_capture(staging: SnapshotStaging) -> Any:
            # The daemon's order: the producer captures the collector right after the
            # rollout, the trainer stages the learner after its update.
            collected = collector.state_dict()
            staged = staging.stage({"learner": learner.state_dict()})
            staged.state["collector"] = collected
            return staged

        def navrl_full() -> Any:
            return {"learner": learner.state_dict(), "collector": collector.state_dict()}

        results.append(measure("navrl", navrl_capture, navrl_full, args.repeats, tmp, rollout))
        big = synthetic_state(args.synthetic_mb, args.device)
        results.append(
            measure(
                f"synthetic_{args.synthetic_mb}mb",
                lambda staging: staging.stage(big),
                lambda: big,
                args.repeats,
                tmp,
                rollout,
            )
        )
    print(
        json.dumps(
            {
                "benchmark": "checkpoint_stall",
                "device": args.device,
                "cpu": platform.processor() or platform.machine(),
                "cores": os.cpu_count(),
                "torch": torch.__version__,
                "torch_threads": torch.get_num_threads(),
                "repeats": args.repeats,
                "load_average_1min_end": os.getloadavg()[0],
                "results": results,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
