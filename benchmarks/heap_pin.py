"""What pinning glibc's mmap threshold costs in throughput, and what it does to RSS, as JSON.

`run.mmap_threshold_bytes` (runtime/heap.py) makes every allocation of at least that size a
mapping of its own, unmapped when freed: a syscall and fresh zeroed pages each time, where
glibc's dynamic threshold would reuse arena memory. This runs the real daemon
(`navrl-daemon run --config config/default.toml`, a process per run, a fresh state dir)
with each pinned threshold of `--thresholds` and with 0 (glibc's dynamic threshold) in
turns, `--repeats` times, each for `--frames` frames at the soak's busy settings (a
checkpoint every iteration, every rollout archived), and reports per variant: frames/s
between the first and the last history row (start-up excluded), and the process's
anonymous RSS sampled every 0.5 s after that first row (median and peak); medians and
spread over the repeats, and each pin's ratios to dynamic. (The RSS *slope* over hours is
benchmarks/soak.py's.)

Run: `OMP_NUM_THREADS=1 .venv/bin/python benchmarks/heap_pin.py [--repeats 3]
[--frames 102400] [--thresholds 131072,1048576] [KEY=VALUE ...]`
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import soak  # benchmarks/, on the path when run as a script
from suite_time import spread

from navrl_daemon.storage.history import HISTORY_FILE, read_jsonl

REPO = Path(__file__).resolve().parents[1]
# The thresholds compared by default: glibc's dynamic one (0), a pin at its starting value
# and the daemon's default.
THRESHOLDS = [0, 128 * 1024, 1024 * 1024]
# The soak's busy stages, without its evaluations (they would time the eval env too), and
# a history row every iteration (the frames/s are read off them).
BUSY = [*soak.BUSY, "eval.interval=0", "log.summary_interval=1"]


def variant_name(threshold: int) -> str:
    """'dynamic' for 0, else the pinned threshold in KiB: 'pinned_128k'."""
    return "dynamic" if threshold == 0 else f"pinned_{threshold // 1024}k"


def rss_anon_bytes(pid: int) -> int | None:
    """Anonymous resident memory (RssAnon): what the allocator holds, without the file
    pages of libraries, which move with the machine's page cache."""
    try:
        return soak.status_fields(pid).get("RssAnon")
    except OSError:  # the process has just ended
        return None


def one_run(threshold: int, frames: int, config: Path, overrides: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        args = [
            *BUSY,
            f"run.total_frames={frames}",
            f"run.mmap_threshold_bytes={threshold}",
            *overrides,
        ]
        history = state / HISTORY_FILE
        env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
        env.pop("GLIBC_TUNABLES", None)
        daemon = ["-m", "navrl_daemon", "run", "--config", str(config), "--state-dir", str(state)]
        proc = subprocess.Popen(
            [sys.executable, *daemon, *args],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        samples: list[int] = []
        while proc.poll() is None:
            if history.exists() and history.stat().st_size:  # start-up is over
                rss = rss_anon_bytes(proc.pid)
                if rss is not None:
                    samples.append(rss)
            time.sleep(0.5)
        rows = read_jsonl(history).rows
    if proc.returncode != 0 or len(rows) < 2:
        return {"error": f"exit {proc.returncode}, {len(rows)} history rows"}
    first, last = rows[0], rows[-1]
    return {
        "frames_per_s": round(
            (last["frames"] - first["frames"]) / (last["time"] - first["time"]), 1
        ),
        "iterations": last["iteration"],
        "rss_anon_median_mb": round(statistics.median(samples) / 1e6, 1) if samples else None,
        "rss_anon_peak_mb": round(max(samples) / 1e6, 1) if samples else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--frames", type=int, default=102_400)
    ap.add_argument("--config", type=Path, default=REPO / "config" / "default.toml")
    ap.add_argument(
        "--thresholds",
        default=",".join(map(str, THRESHOLDS)),
        help="comma-separated run.mmap_threshold_bytes values; 0 (dynamic) is always run",
    )
    ap.add_argument("overrides", nargs="*", help="KEY=VALUE after the benchmark's own")
    args = ap.parse_args()
    thresholds = sorted({0, *(int(t) for t in args.thresholds.split(","))})
    variants = {variant_name(t): t for t in thresholds}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    load_before = os.getloadavg()
    for _ in range(args.repeats):
        for name, threshold in variants.items():
            runs[name].append(one_run(threshold, args.frames, args.config, args.overrides))
    result: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "frames": args.frames,
        "config": str(
            args.config.relative_to(REPO) if args.config.is_relative_to(REPO) else args.config
        ),
        "overrides": args.overrides,
    }
    medians: dict[str, dict[str, float]] = {}
    for name, name_runs in runs.items():
        ok = [r for r in name_runs if "error" not in r]
        summary: dict[str, Any] = {"runs": name_runs}
        for key in ("frames_per_s", "rss_anon_median_mb", "rss_anon_peak_mb"):
            values = [r[key] for r in ok if r[key] is not None]
            if values:
                summary[key] = spread(values)
                medians.setdefault(name, {})[key] = summary[key]["median"]
        result[name] = summary
    if "dynamic" in medians:
        result["over_dynamic"] = {
            name: {
                key: round(value / medians["dynamic"][key], 3)
                for key, value in name_medians.items()
                if key in medians["dynamic"]
            }
            for name, name_medians in medians.items()
            if name != "dynamic"
        }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
