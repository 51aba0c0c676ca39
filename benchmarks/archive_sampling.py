"""Archive sampling: batches/s of 256-transition samples from an archive file, ArchiveReader
vs a naive per-sample "read and decompress the whole segment" baseline. Prints JSON.

The archive is built from real embedded-env rollouts (NavRL's pillar field, drones spawned
inside it), encoded once and appended again and again (new iteration numbers, same
bytes) until the file holds `--stored-mib` of compressed data. The file is freshly
written, so it sits in the page cache: this measures index, HDF5 reads and decompression,
not the disk; the `page_cache: cold` rows drop the file's pages before every repeat
(`posix_fadvise(DONTNEED)`), so they read from the disk.
Run: `.venv/bin/python benchmarks/archive_sampling.py [--stored-mib 4096]`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from navrl_daemon.config import load_config
from navrl_daemon.rl.training import Training
from navrl_daemon.storage.archive import (
    ArchiveFile,
    ArchiveWriter,
    EncodedSegment,
    Schema,
    archive_name,
    encode_segments,
)
from navrl_daemon.storage.episode_store import ArchiveReader, as_tensordict, rollout_arrays

PILLARS = ["run.device=cpu", "env.navigation.spawn=local", "env.goal_distance=[5.0, 15.0]"]


def collect(num_envs: int, rollouts: int) -> list[dict[str, np.ndarray]]:
    cfg = load_config("config/navrl-original.toml", [*PILLARS, f"env.num_envs={num_envs}"])
    training = Training.build(cfg, "cpu")
    for _ in range(2):  # let the episodes get under way
        training.collector.collect(training.buffer)
    out = []
    for _ in range(rollouts):
        training.collector.collect(training.buffer)
        out.append(rollout_arrays(training.buffer, copy=True))
    return out


def build_archive(
    path: Path, stored_bytes: int, data: list[dict[str, np.ndarray]], version: int
) -> dict[str, Any]:
    schema = Schema.for_rollout(data[0], version=version)
    num_envs = next(iter(data[0].values())).shape[0]
    encoded: list[EncodedSegment] = []
    for arrays in data:
        encoded += encode_segments(schema, arrays, range(num_envs), iteration=0, policy_version=0)
    writer = ArchiveWriter(path, schema)
    iteration = 0
    t0 = time.perf_counter()
    while writer.stored_bytes < stored_bytes:
        for start in range(0, len(encoded), num_envs):
            part = encoded[start : start + num_envs]
            writer.append(
                [
                    EncodedSegment(iteration, s.env, iteration, s.length, s.raw_bytes, s.blobs)
                    for s in part
                ]
            )
            iteration += 1
    writer.close()
    return {
        "format": version,
        "file_bytes": path.stat().st_size,
        "stored_bytes": writer.stored_bytes,
        "raw_bytes": writer.raw_bytes,
        "segments": writer.segments,
        "distinct_segments": len(encoded),
        "write_s": time.perf_counter() - t0,
    }


def naive_batch(f: ArchiveFile, reader: ArchiveReader, frames: np.ndarray) -> Any:
    """Per sample: read and decompress its whole segment, keep one step. No cache, no threads."""
    segments, steps = reader.index.locate(frames)
    rows: dict[str, list[np.ndarray]] = {spec.path: [] for spec in f.schema.keys}
    for s, t in zip(segments.tolist(), steps.tolist(), strict=True):
        decoded = f.segment(s)
        for path, array in decoded.items():
            rows[path].append(array[t])
    return as_tensordict(f.schema, {k: np.stack(v) for k, v in rows.items()}, [len(frames)])


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def time_batches(sample: Any, batches: int, repeats: int, before: Any = None) -> dict[str, float]:
    rates = []
    for _ in range(repeats):
        if before is not None:
            before()
        t0 = time.perf_counter()
        for _ in range(batches):
            sample()
        rates.append(batches / (time.perf_counter() - t0))
    return spread(rates)


def drop_page_cache(path: Path) -> None:
    """Evict the file's (clean) pages from the kernel's page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def decode_scaling(path: Path, version: int, args: argparse.Namespace) -> dict[str, Any]:
    """Decode the 256 distinct segments of a 256-sample batch (new ones every batch: no
    cache) in 1..N threads or worker processes; the variants alternate, batch by batch."""
    variants = [("threads", w) for w in args.workers] + [("processes", w) for w in args.workers]
    readers = {
        (kind, w): ArchiveReader([path], workers=w, cache_bytes=0, processes=kind == "processes")
        for kind, w in variants
    }
    rng = np.random.default_rng(1)
    seconds: dict[tuple[str, int], list[float]] = {v: [] for v in variants}
    try:
        segments = readers[variants[0]].segments
        for _ in range(args.decode_repeats):
            positions = rng.choice(segments, size=args.batch, replace=False)
            for v in variants:
                t0 = time.perf_counter()
                readers[v].decode_positions(positions)
                seconds[v].append(time.perf_counter() - t0)
    finally:
        for reader in readers.values():
            reader.close()
    base = statistics.median(seconds[variants[0]])
    results = []
    for kind, w in variants:
        median = statistics.median(seconds[(kind, w)])
        results.append(
            {
                "decoder": kind,
                "workers": w,
                "batch_s": spread(seconds[(kind, w)]),
                "speedup_vs_1_thread": base / median,
                "speedup_vs_1_of_its_kind": statistics.median(seconds[(kind, args.workers[0])])
                / median,
            }
        )
    return {
        "format": version,
        "segments_per_batch": args.batch,
        "results": results,
        "load_average_1min": os.getloadavg()[0],
    }


def sample_archive(path: Path, version: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    results: list[dict[str, Any]] = []
    with ArchiveReader([path], workers=1, cache_bytes=0) as plain, ArchiveFile.open(path) as f:
        naive = time_batches(
            lambda: naive_batch(f, plain, rng.integers(0, plain.frames, args.batch)),
            max(1, args.batches // 4),
            args.repeats,
        )
        results.append({"sampler": "naive per-sample whole-segment decode", **naive})
    for processes, workers, cache_mib in [
        *((False, w, c) for w in args.workers for c in (0, 256)),
        *((True, w, 0) for w in args.workers),
    ]:
        with ArchiveReader(
            [path], workers=workers, cache_bytes=cache_mib << 20, processes=processes
        ) as reader:
            for _ in range(args.batches):  # warm the cache as a long run would
                reader.sample(args.batch, rng)
            rate = time_batches(
                lambda r=reader: r.sample(args.batch, rng), args.batches, args.repeats
            )
            lookups = reader.cache.hits + reader.cache.misses
            results.append(
                {
                    "sampler": "ArchiveReader" + (" (processes)" if processes else ""),
                    "workers": workers,
                    "cache_mib": cache_mib,
                    "cache_hit_ratio": reader.cache.hits / lookups if lookups else 0.0,
                    **rate,
                }
            )
    # A cold page cache: the file's pages dropped before every repeat, so a batch reads
    # its segments from the disk (a repeat's 20 batches touch ~5k of the file's segments).
    for processes, workers in [(False, 1), (True, max(args.workers))]:
        with ArchiveReader([path], workers=workers, cache_bytes=0, processes=processes) as reader:
            rate = time_batches(
                lambda r=reader: r.sample(args.batch, rng),
                args.batches,
                args.repeats,
                before=lambda: drop_page_cache(path),
            )
            results.append(
                {
                    "sampler": "ArchiveReader" + (" (processes)" if processes else ""),
                    "workers": workers,
                    "cache_mib": 0,
                    "page_cache": "cold",
                    **rate,
                }
            )
    # Same 256 transitions per batch, as 32 windows of 8 steps: 8x fewer segments.
    with ArchiveReader([path], workers=max(args.workers), cache_bytes=0) as reader:
        rate = time_batches(
            lambda: reader.windows(args.batch // 8, 8, rng), args.batches, args.repeats
        )
        results.append(
            {"sampler": "ArchiveReader.windows(batch/8, 8)", "workers": max(args.workers), **rate}
        )
    return [{"format": version, **r} for r in results]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stored-mib", type=int, default=256, help="compressed archive size")
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--rollouts", type=int, default=4, help="distinct rollouts repeated")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--batches", type=int, default=20, help="batches per repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--formats", type=int, nargs="+", default=[1, 2], help="archive formats")
    parser.add_argument(
        "--decode-repeats", type=int, default=30, help="batches per decoder in decode_scaling"
    )
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to write (default: a temp dir)"
    )
    args = parser.parse_args()

    torch.manual_seed(0)
    data = collect(args.num_envs, args.rollouts)
    archives, results, scaling = [], [], []
    for version in args.formats:
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            path = Path(tmp) / archive_name(0)
            archives.append(build_archive(path, args.stored_mib << 20, data, version))
            scaling.append(decode_scaling(path, version, args))
            results += sample_archive(path, version, args)
    naive = {r["format"]: r for r in results if r["sampler"].startswith("naive")}
    first = naive[args.formats[0]]["median"]
    for r in results:
        r["speedup_vs_naive"] = r["median"] / naive[r["format"]]["median"]
        r[f"speedup_vs_naive_format{args.formats[0]}"] = r["median"] / first
    doc = {
        "benchmark": "archive_sampling",
        "unit": "batches_per_s",
        "batch": args.batch,
        "repeats": args.repeats,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average_1min": os.getloadavg()[0],
        "archives": archives,
        "decode_scaling": scaling,
        "results": results,
    }
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
