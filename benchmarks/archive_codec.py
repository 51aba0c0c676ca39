"""Archive codec: ratio and MB/s per format/filter/mode/level on real embedded-env rollouts,
and decompression thread scaling (1 → N workers) for a 256-sample batch. Prints JSON.

Data: rollouts of the embedded env collected by a random-init policy, in two layouts:
`pillars` (NavRL's 40 m field with 350 pillars and 80 dynamic obstacles, drones spawned
inside it so the LiDAR sees pillars) and `open` (config/default.toml: no obstacles).
Speeds are single-thread, raw (uncompressed) bytes per second, over every segment of the
rollouts; the baseline is format 1 (one blob per key), episode mode, no filter, level 0:
the default before format 2 (one packed blob per segment, the default now).
Run: `.venv/bin/python benchmarks/archive_codec.py [--num-envs 256 --rollouts 8]`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
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
        "config/navrl-original.toml",
        ["run.device=cpu", "env.navigation.spawn=local", "env.goal_distance=[5.0, 15.0]"],
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
FORMATS = (1, 2)


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
    data: list[Arrays], version: int, mode: str, filter_: str, level: int, repeats: int
) -> dict[str, Any]:
    schema = Schema.for_rollout(
        data[0],
        mode=mode,  # type: ignore[arg-type]
        level=level,
        default_filter=filter_,  # type: ignore[arg-type]
        version=version,
    )
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
    for j, spec in enumerate(schema.keys if version == 1 else ()):  # format 2: one blob
        key_raw = sum(arrays[spec.path].nbytes for arrays in data)
        per_key[spec.path] = round(key_raw / sum(len(s.blobs[j]) for s in segments), 3)
    return {
        "format": version,
        "mode": mode,
        "filter": filter_,
        "level": level,
        "raw_bytes": raw,
        "stored_bytes": stored,
        "ratio": raw / stored,
        "encode_MBps": spread(enc),
        "decode_MBps": spread(dec),
        **({"ratio_by_key": per_key} if per_key else {}),
    }


def thread_scaling(
    data: list[Arrays], workers: list[int], batch: int, repeats: int, version: int
) -> dict[str, Any]:
    """Decode the distinct segments of a `batch`-transition sample with 1..N threads."""
    out: dict[str, Any] = {
        "format": version,
        "batch": batch,
        "segments_decoded": None,
        "results": [],
    }
    stores = {}
    for w in workers:  # no cache: every batch decodes
        stores[w] = EpisodeStore(1 << 40, workers=w, cache_bytes=0, version=version)
        for i, rollout in enumerate(data):
            stores[w].add(_as_td(rollout), iteration=i)
    segments = stores[workers[0]].segments
    positions = np.random.default_rng(0).choice(segments, size=min(batch, segments), replace=False)
    out["segments_decoded"] = len(positions)
    raw = sum(a.nbytes for arrays in data for a in arrays.values()) * len(positions) / segments
    seconds: dict[int, list[float]] = {w: [] for w in workers}
    faults = dict.fromkeys(workers, 0)
    for _ in range(repeats):  # thread counts alternate, so a load change hits them all
        for w in workers:
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0 = time.perf_counter()
            stores[w].decode_positions(positions)
            seconds[w].append(time.perf_counter() - t0)
            faults[w] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
    for w in workers:
        stores[w].close()
        out["results"].append(
            {
                "workers": w,
                "batch_s": spread(seconds[w]),
                "decode_MBps": raw / statistics.median(seconds[w]) / 1e6,
                "minor_page_faults_per_batch": faults[w] / repeats,
            }
        )
    out["load_average_1min"] = os.getloadavg()[0]
    base = out["results"][0]["batch_s"]["median"]
    for r in out["results"]:
        r["speedup_vs_1"] = base / r["batch_s"]["median"]
    return out


def lz4_control(workers: list[int], repeats: int) -> dict[str, Any]:
    """What the machine allows at all: LZ4 frames of rounded random floats (no Python work
    per call but the call) decompressed with 1..N threads, in tasks of many frames as the
    reader makes them: 64 x 1 MiB, and 256 x 55 KB (a segment's size, but slower to decode
    than real segments). Near 1.0x for both means no core was free to scale onto."""
    rng = np.random.default_rng(0)
    block = (rng.random(1 << 18, dtype=np.float32) * 100).round().astype(np.float32).tobytes()
    out: dict[str, Any] = {}
    for name, frames in (
        ("64 x 1 MiB", [lz4.frame.compress(block) for _ in range(64)]),
        ("256 x 55 KB", [lz4.frame.compress(block[:55_000]) for _ in range(256)]),
    ):
        tasks = [frames[i :: 2 * max(workers)] for i in range(2 * max(workers))]
        seconds: dict[int, list[float]] = {w: [] for w in workers}
        pools = {w: ThreadPoolExecutor(w) for w in workers}
        for _ in range(repeats):
            for w in workers:
                t0 = time.perf_counter()
                list(pools[w].map(lambda task: [lz4.frame.decompress(f) for f in task], tasks))
                seconds[w].append(time.perf_counter() - t0)
        for pool in pools.values():
            pool.shutdown()
        medians = {w: statistics.median(v) for w, v in seconds.items()}
        out[name] = {
            "call_us_1_worker": medians[workers[0]] / len(frames) * 1e6,
            "speedup_vs_1": {str(w): medians[workers[0]] / m for w, m in medians.items()},
        }
    return {
        "what": "LZ4 frames decompressed in a thread pool",
        **out,
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
    parser.add_argument(
        "--scaling-repeats", type=int, default=30, help="batches timed per thread count"
    )
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
        results = [time_codec(data, v, *codec, args.repeats) for v in FORMATS for codec in CODECS]
        base = results[0]
        for r in results:
            r["ratio_vs_baseline"] = r["ratio"] / base["ratio"]
            r["encode_speed_vs_baseline"] = (
                r["encode_MBps"]["median"] / base["encode_MBps"]["median"]
            )
            r["decode_speed_vs_baseline"] = (
                r["decode_MBps"]["median"] / base["decode_MBps"]["median"]
            )
        scaling = {
            f"format{v}": thread_scaling(data, args.workers, 256, args.scaling_repeats, v)
            for v in FORMATS
        }
        first = scaling["format1"]["results"][0]["batch_s"]["median"]
        for part in scaling.values():
            for r in part["results"]:
                r["speedup_vs_format1_1_worker"] = first / r["batch_s"]["median"]
        scaling["control"] = lz4_control(args.workers, args.scaling_repeats)
        doc["layouts"][layout] = {"codecs": results, "decode_thread_scaling": scaling}
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
