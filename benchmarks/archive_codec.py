"""Archive codec: ratio and MB/s per filter/mode/level on real embedded-env rollouts, and
decompression thread scaling (1 → N workers) for a 256-sample batch. Prints JSON.

Data: rollouts of the embedded env collected by a random-init policy, in two layouts:
`pillars` (NavRL's 40 m field with 350 pillars and 80 dynamic obstacles, drones spawned
inside it so the LiDAR sees pillars) and `open` (config/default.toml: no obstacles).
Speeds are single-thread, raw (uncompressed) bytes per second, over every segment of the
rollouts; the baseline is episode mode, no filter, level 0.
Run: `.venv/bin/python benchmarks/archive_codec.py [--num-envs 256 --rollouts 8]`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import lz4.frame
import numpy as np
import torch

from navrl_daemon.config import load_config
from navrl_daemon.rl.training import Training
from navrl_daemon.storage.archive import Schema, decode_blobs, encode_segments
from navrl_daemon.storage.episode_store import Arrays, EpisodeStore, rollout_arrays

LAYOUTS = {
    "pillars": (
        "config/navrl.toml",
        ["run.device=cpu", "env.spawn=local", "env.goal_distance=[5.0, 15.0]"],
    ),
    "open": ("config/default.toml", ["run.device=cpu"]),
}
CODECS = [
    ("episode", "none", 0),
    ("episode", "shuffle", 0),
    ("episode", "delta", 0),
    ("episode", "delta+shuffle", 0),
    ("episode", "none", 9),
    ("episode", "delta+shuffle", 9),
    ("frame", "none", 0),
    ("frame", "shuffle", 0),
]


def collect(layout: str, num_envs: int, rollouts: int, warmup: int) -> list[Arrays]:
    path, overrides = LAYOUTS[layout]
    cfg = load_config(path, [*overrides, f"env.num_envs={num_envs}"])
    training = Training.build(cfg, "cpu")
    out = []
    for i in range(warmup + rollouts):
        training.collector.collect(training.buffer)
        if i >= warmup:
            out.append(rollout_arrays(training.buffer, copy=True))
    return out


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def time_codec(
    data: list[Arrays], mode: str, filter_: str, level: int, repeats: int
) -> dict[str, Any]:
    schema = Schema.for_rollout(data[0], mode=mode, level=level, default_filter=filter_)  # type: ignore[arg-type]
    raw = sum(a.nbytes for arrays in data for a in arrays.values())
    n = next(iter(data[0].values())).shape[0]
    enc, dec = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        segments = [
            s
            for arrays in data
            for s in encode_segments(schema, arrays, range(n), iteration=0, policy_version=0)
        ]
        enc.append(raw / (time.perf_counter() - t0) / 1e6)
        t0 = time.perf_counter()
        for s in segments:
            decode_blobs(schema, s.blobs, s.length, "bench", 0)
        dec.append(raw / (time.perf_counter() - t0) / 1e6)
    stored = sum(s.stored_bytes for s in segments)
    per_key = {}
    for j, spec in enumerate(schema.keys):
        key_raw = sum(arrays[spec.path].nbytes for arrays in data)
        per_key[spec.path] = round(key_raw / sum(len(s.blobs[j]) for s in segments), 3)
    return {
        "mode": mode,
        "filter": filter_,
        "level": level,
        "raw_bytes": raw,
        "stored_bytes": stored,
        "ratio": raw / stored,
        "encode_MBps": spread(enc),
        "decode_MBps": spread(dec),
        "ratio_by_key": per_key,
    }


def thread_scaling(
    data: list[Arrays], workers: list[int], batch: int, repeats: int
) -> dict[str, Any]:
    """Decode the distinct segments of a `batch`-transition sample with 1..N threads."""
    out: dict[str, Any] = {"batch": batch, "segments_decoded": None, "results": []}
    for w in workers:
        store = EpisodeStore(1 << 40, workers=w, cache_bytes=0)  # no cache: every batch decodes
        for i, rollout in enumerate(data):
            store.add(_as_td(rollout), iteration=i)
        rng = np.random.default_rng(0)
        positions = rng.choice(store.segments, size=min(batch, store.segments), replace=False)
        out["segments_decoded"] = len(positions)
        raw = (
            sum(a.nbytes for arrays in data for a in arrays.values())
            * len(positions)
            / store.segments
        )
        seconds = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            store.decode_positions(positions)
            seconds.append(time.perf_counter() - t0)
        store.close()
        out["results"].append(
            {
                "workers": w,
                "batch_s": spread(seconds),
                "decode_MBps": raw / statistics.median(seconds) / 1e6,
            }
        )
    base = out["results"][0]["batch_s"]["median"]
    for r in out["results"]:
        r["speedup_vs_1"] = base / r["batch_s"]["median"]
    out["control"] = lz4_control(workers, repeats)
    return out


def lz4_control(workers: list[int], repeats: int) -> dict[str, Any]:
    """What the machine allows at all: 1 MiB LZ4 frames (no Python overhead per call)
    decompressed with 1..N threads. Near 1.0x here means no core was free to scale onto."""
    rng = np.random.default_rng(0)
    block = (rng.random(1 << 18, dtype=np.float32) * 100).round().astype(np.float32).tobytes()
    frames = [lz4.frame.compress(block) for _ in range(64)]
    medians = {}
    for w in workers:
        with ThreadPoolExecutor(w) as pool:
            seconds = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                list(pool.map(lz4.frame.decompress, frames))
                seconds.append(time.perf_counter() - t0)
        medians[w] = statistics.median(seconds)
    return {
        "what": "64 x 1 MiB LZ4 frames, decompressed in a thread pool",
        "speedup_vs_1": {str(w): medians[workers[0]] / m for w, m in medians.items()},
        "load_average_1min": os.getloadavg()[0],
    }


def _as_td(arrays: Arrays) -> Any:
    from tensordict import TensorDict

    first = next(iter(arrays.values()))
    td = TensorDict({}, batch_size=list(first.shape[:2]))
    for path, a in arrays.items():
        td.set(tuple(path.split("/")), torch.from_numpy(a))
    return td


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--rollouts", type=int, default=4, help="rollouts measured per layout")
    parser.add_argument("--warmup-rollouts", type=int, default=4, help="collected, not measured")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS))
    args = parser.parse_args()

    torch.manual_seed(0)
    doc: dict[str, Any] = {
        "benchmark": "archive_codec",
        "num_envs": args.num_envs,
        "rollouts": args.rollouts,
        "repeats": args.repeats,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "layouts": {},
    }
    for layout in args.layouts:
        data = collect(layout, args.num_envs, args.rollouts, args.warmup_rollouts)
        results = [time_codec(data, *codec, args.repeats) for codec in CODECS]
        base = results[0]
        for r in results:
            r["ratio_vs_baseline"] = r["ratio"] / base["ratio"]
            r["encode_speed_vs_baseline"] = (
                r["encode_MBps"]["median"] / base["encode_MBps"]["median"]
            )
            r["decode_speed_vs_baseline"] = (
                r["decode_MBps"]["median"] / base["decode_MBps"]["median"]
            )
        doc["layouts"][layout] = {
            "codecs": results,
            "decode_thread_scaling": thread_scaling(data, args.workers, 256, args.repeats),
        }
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
