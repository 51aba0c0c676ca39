"""Prefetch: batches/s of the HDF5 prefetcher (worker processes, sorted run reads, batched
resize into shared-memory slots) vs the naive reader of the lazy-loading write-up (one
thread, `f[key][i]` per index and camera, resize per image in the training loop), side by
side in one run; the data-wait share of a trainer slower than the prefetcher; and the
prefetcher's resident memory relative to the dataset. Prints JSON.

The dataset is `navrl-daemon dataset synth` layout A, HWC, 3 cameras of 256x256, written
fresh (so a dataset smaller than RAM sits in the page cache: then this measures HDF5
reads, copies and resizing, not the disk). Memory does not grow with the dataset: run
`--gib 48` (larger than this machine's RAM) to see it against a big one. Repeats
interleave the two readers; each prefetch repeat starts a fresh prefetcher and consumes
`depth + 1` batches before timing (steady state, not a pre-filled queue).
Run: `.venv/bin/python benchmarks/prefetch.py [--gib 2] [--repeats 3]`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch

from navrl_daemon.offline.dataset_synth import SynthSpec, samples_for_bytes, write_synth
from navrl_daemon.offline.datasets import MultimodalDataset, as_bchw, resize_images
from navrl_daemon.offline.prefetch import BatchSchedule, Prefetcher


def _memory_total_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return 0


def spread(values: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "values": [round(v, 4) for v in values],
    }


def naive_batches(
    data: MultimodalDataset, size: int, batch: int, count: int, seed: int
) -> tuple[float, float]:
    """The write-up's loader: per index, per camera, an h5py read and a resize.
    Batches/s and CPU seconds per batch."""
    schedule = BatchSchedule(len(data), batch, seed)
    rng = np.random.default_rng(seed)
    df = data.files[0]
    with h5py.File(df.path, "r") as f:
        datasets = [(f[c.path], c.format) for c in df.cameras]
        t0, cpu0 = time.perf_counter(), time.process_time()
        for seq in range(count):
            indices = rng.permutation(schedule.indices(seq))  # a sampler's order: unsorted
            images = torch.empty((batch, len(datasets), 3, size, size), dtype=torch.uint8)
            for row, i in enumerate(indices):
                for cam, (ds, fmt) in enumerate(datasets):
                    images[row, cam] = resize_images(as_bchw(ds[i][None], fmt), size)[0]
            data.lowdim(indices)
        return count / (time.perf_counter() - t0), (time.process_time() - cpu0) / count


def memory(pid: int) -> dict[str, int]:
    """Bytes from /proc: rss, pss, anonymous (private data) and the shared-memory part."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        if key in ("Rss", "Pss", "Anonymous", "Pss_Shmem"):
            out[key.lower()] = int(value.split()[0]) * 1024
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def prefetch_run(
    data: MultimodalDataset, args: argparse.Namespace, seed: int, trainer_step_s: float | None
) -> dict[str, Any]:
    parent_before = memory(os.getpid())
    t0 = time.perf_counter()
    with Prefetcher(
        data,
        batch_size=args.batch_size,
        depth=args.depth,
        workers=args.workers,
        image_size=args.image_size,
        seed=seed,
    ) as pf:
        startup_s = time.perf_counter() - t0
        # Workers have asked for their first batches already; sample them before those land.
        idle = [memory(p) for p in pf.pids]
        for _ in range(args.depth + 1):
            pf.next()
        wait0 = pf.stats().wait_seconds_total
        workers_cpu0 = sum(cpu_seconds(p) for p in pf.pids)
        t0, cpu0 = time.perf_counter(), time.process_time()
        for _ in range(args.batches):
            batch = pf.next()
            if trainer_step_s is not None:
                time.sleep(trainer_step_s)  # a GPU-bound step: the CPU stays free
        elapsed = time.perf_counter() - t0
        parent_cpu = (time.process_time() - cpu0) / args.batches
        workers_cpu = (sum(cpu_seconds(p) for p in pf.pids) - workers_cpu0) / args.batches
        wait = pf.stats().wait_seconds_total - wait0
        workers = [memory(p) for p in pf.pids]
        parent = memory(os.getpid())
        slot_bytes = pf.slot_bytes * (args.depth + 1)
        del batch
    return {
        "batches_per_s": args.batches / elapsed,
        "cpu_s_per_batch": {"workers": workers_cpu, "parent": parent_cpu},
        "wait_ratio": wait / elapsed,
        "startup_s": startup_s,
        "workers": workers,
        "workers_at_start": idle,
        "parent_rss_growth_bytes": parent["rss"] - parent_before["rss"],
        "parent_anonymous_growth_bytes": parent["anonymous"] - parent_before["anonymous"],
        "slot_bytes": slot_bytes,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gib", type=float, default=2.0, help="dataset size (default 2 GiB)")
    p.add_argument("--path", type=Path, help="use this dataset instead of writing one")
    p.add_argument("--source-size", type=int, default=256)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--batches", type=int, default=12, help="timed batches per repeat")
    p.add_argument("--naive-batches", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--depth", type=int, default=4)
    args = p.parse_args()
    load_start = os.getloadavg()

    tmp = None
    path = args.path
    write_s = None
    if path is None:
        tmp = Path(tempfile.mkdtemp(prefix="navrl-prefetch-bench-"))
        need = int(args.gib * (1 << 30))
        free = shutil.disk_usage(tmp).free
        if need * 1.2 > free:
            raise SystemExit(f"{tmp}: {need} bytes needed, {free} free; use a smaller --gib")
        path = tmp / "synth.h5"
        samples = samples_for_bytes(need, args.source_size, args.source_size)
        t0 = time.perf_counter()
        write_synth(
            path, SynthSpec(samples=samples, height=args.source_size, width=args.source_size)
        )
        write_s = time.perf_counter() - t0
    try:
        data = MultimodalDataset.load([path])
        torch.set_num_threads(1)  # the naive loader is single-threaded
        naive, naive_cpu, prefetch, runs = [], [], [], []
        for r in range(args.repeats):
            rate_r, cpu_r = naive_batches(
                data, args.image_size, args.batch_size, args.naive_batches, r
            )
            naive.append(rate_r)
            naive_cpu.append(cpu_r)
            run = prefetch_run(data, args, r, trainer_step_s=None)
            prefetch.append(run["batches_per_s"])
            runs.append(run)
        rate = statistics.median(prefetch)
        # A trainer needing 2/3 of what the prefetcher supplies: how long does it wait?
        slow = [prefetch_run(data, args, 100 + r, 1.5 / rate) for r in range(args.repeats)]
        last = runs[-1]
        worker_pss = sum(w["pss"] - w.get("pss_shmem", 0) for w in last["workers"])
        worker_anon = sum(w["anonymous"] for w in last["workers"])
        worker_anon_start = sum(w["anonymous"] for w in last["workers_at_start"])
        dataset_bytes = path.stat().st_size
        lowdim = (data.joint, data.next_joint, data.actions, data.rewards, data.terminals)
        lowdim_bytes = sum(a.nbytes for a in lowdim)
        doc = {
            "benchmark": "prefetch",
            "machine": {
                "cpus": os.cpu_count(),
                "platform": platform.platform(),
                "torch": torch.__version__,
                "h5py": h5py.__version__,
                "loadavg_start": [round(x, 2) for x in load_start],
                "loadavg_end": [round(x, 2) for x in os.getloadavg()],
            },
            "dataset": {
                "bytes": dataset_bytes,
                "transitions": len(data),
                "image": [3, args.source_size, args.source_size, 3],
                "resized_to": args.image_size,
                "write_s": write_s,
                # Written just before the run: in the page cache if it fits in RAM;
                # otherwise the reads partly come from the disk.
                "fits_in_page_cache": dataset_bytes < _memory_total_bytes(),
            },
            "batch_size": args.batch_size,
            "workers": args.workers,
            "depth": args.depth,
            "naive_batches_per_s": spread(naive),
            "prefetch_batches_per_s": spread(prefetch),
            "ratio_median": rate / statistics.median(naive),
            "cpu_s_per_batch": {
                "naive": spread(naive_cpu),
                "prefetch_workers": spread([r["cpu_s_per_batch"]["workers"] for r in runs]),
                "prefetch_parent": spread([r["cpu_s_per_batch"]["parent"] for r in runs]),
                "note": "CPU time, so independent of other load; naive / (workers + parent) "
                "is the CPU cost ratio per batch",
            },
            "prefetch_startup_s": spread([r["startup_s"] for r in runs]),
            "prefetch_wait_ratio_unthrottled": spread([r["wait_ratio"] for r in runs]),
            "trainer_at_two_thirds_rate": {
                "step_s": 1.5 / rate,
                "wait_ratio": spread([s["wait_ratio"] for s in slow]),
                "note": "trainer step is a sleep (GPU-bound step, CPU free)",
            },
            "memory": {
                "slots_shm_bytes": last["slot_bytes"],
                "workers_pss_without_slots_bytes": worker_pss,
                "workers_anonymous_bytes": worker_anon,
                "workers_anonymous_at_start_bytes": worker_anon_start,
                "parent_rss_growth_bytes": last["parent_rss_growth_bytes"],
                "lowdim_in_ram_bytes": lowdim_bytes,
                "pss_plus_slots_over_dataset": (worker_pss + last["slot_bytes"]) / dataset_bytes,
                "data_bytes_over_dataset": (worker_anon - worker_anon_start + last["slot_bytes"])
                / dataset_bytes,
                "note": "workers' PSS and anonymous memory include their interpreter, torch, "
                "h5py and whatever the __main__ module imports (spawn re-imports it); the data "
                "part is the slots plus the workers' anonymous growth after start",
            },
        }
        print(json.dumps(doc, indent=2))
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
