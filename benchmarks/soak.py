"""Soak: the real daemon, every stage busy, for minutes to hours; what time does to it. JSON.

Starts `navrl-daemon run` as a subprocess (a fresh state dir, `config/default.toml` plus
the overrides below: a checkpoint every iteration, every rollout archived under a small
cap so the archive rotates, an evaluation every 10 iterations) and samples it every
`--interval-s`: RSS (anonymous and file-backed), open fds, threads, child processes, CPU
seconds, state-dir bytes (per top-level entry), log bytes, frames and iterations (from its
`/metrics`), and the machine's load average. After `--warmup-min` it fits a line to each
series and reports the slope per hour, then a verdict against issue #27's goals:

- RSS slope after the warm-up <= 1 MB/h;
- threads and fds steady after the warm-up (the second half's median no higher than the
  first half's, no sample more than 2 above it: a sample taken while a checkpoint is
  written counts its file), children constant; whether threads and fds were strictly
  constant is reported too;
- state-dir bytes bounded by the configured caps: archive <= archive.max_total_bytes
  plus one rollout, checkpoints <= (keep_last + keep_best + 1) files; the append-only records
  (history.jsonl, eval/results.jsonl) grow with the run by design and are reported as
  bytes per hour, not capped;
- frames/s in the last window (10 minutes, or a third of a shorter run after the
  warm-up) >= 0.95x the first window after the warm-up. The machine may be shared: the
  load average of each window is in the JSON, and frames per CPU-second of the daemon
  (its own work rate, much less sensitive to other processes' load) is compared as well.

With `SOAK_MALLOC_TRIM_S=S` in the environment, a probed daemon also calls glibc's
`malloc_trim(0)` every S seconds (an experiment on where RSS goes, not a daemon feature).
`--probe malloc` writes glibc's `malloc_info` at the end of the warm-up, half-way and at
the end (what the allocator holds from the system and how much of it sits free in its
bins: fragmentation, not live data); `--probe tracemalloc` also starts tracemalloc at the
end of the warm-up (slower from then on: its numbers are not the soak's) and diffs the
half-way snapshot against the last by allocation site: what Python objects grew. Torch
tensor storage and its allocator caches are not Python allocations and never show up
there.

Run: `OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python benchmarks/soak.py --minutes 60
[--warmup-min 5] [--out soak.json] [KEY=VALUE ...]` (overrides after the defaults below).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

# Every stage busy: the writer after every iteration, the archiver on every rollout (under
# a cap it reaches in minutes, so rotation runs all along), the evaluator every 10.
BUSY = [
    "checkpoint.interval=1",
    "checkpoint.keep_last=3",
    "archive.interval=1",
    "archive.max_total_bytes=16777216",
    "archive.max_file_bytes=2097152",
    "eval.interval=10",
    "metrics.port=0",
    "run.total_frames=1000000000000",
]
GOALS = {"rss_slope_mb_per_h": 1.0, "frames_per_s_ratio": 0.95}
METRICS = (
    "navrl_frames_total",
    "navrl_iterations_total",
    "navrl_archive_dropped_total",
    "navrl_archive_disk_bytes",
    "navrl_archive_files",
    "navrl_archive_rotated_files_total",
    "navrl_checkpoint_failures_total",
    "navrl_evaluations_total",
    "navrl_archive_segments_total",
    'navrl_archive_bytes_total{kind="stored"}',
)
TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


# ---------------------------------------------------------------------------- sampling


@dataclass
class ProcessProbe:
    """What /proc says about one process and its descendants (Linux)."""

    pid: int

    def sample(self) -> dict[str, Any]:
        status = status_fields(self.pid)
        stat = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return {
            "rss_bytes": status["VmRSS"],
            "rss_anon_bytes": status.get("RssAnon", 0),
            "rss_file_bytes": status.get("RssFile", 0),
            "threads": status["Threads"],
            "fds": len(os.listdir(f"/proc/{self.pid}/fd")),
            "children": len(descendants(self.pid)),
            "cpu_s": round((int(stat[11]) + int(stat[12])) / TICK, 2),  # utime + stime
            **_maps(self.pid),
        }


def _maps(pid: int) -> dict[str, int]:
    """Resident bytes of the main heap ([heap]: glibc's main arena) and of unnamed anonymous
    mappings (thread arenas, large allocations, torch's), and how many of those there are."""
    heap = anon = count = 0
    name = None
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and not fields[0].endswith(":"):
            name = fields[5] if len(fields) > 5 else ""
            count += name == ""
        elif fields and fields[0] == "Rss:":
            size = int(fields[1]) * 1024
            if name == "[heap]":
                heap += size
            elif name == "":
                anon += size
    return {"rss_heap_bytes": heap, "rss_anon_maps_bytes": anon, "anon_maps": count}


def status_fields(pid: int) -> dict[str, int]:
    """/proc/PID/status: Threads as a count, every kB field in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        parts = value.split()
        if name in ("Threads",):
            out[name] = int(parts[0])
        elif parts and parts[-1] == "kB":
            out[name] = int(parts[0]) * 1024
    return out


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (children, their children, ...)."""
    parent_of = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue  # gone since listdir
            parent_of[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        kids = [p for p, pp in parent_of.items() if pp == parent]
        found += kids
        frontier += kids
    return found


def dir_bytes(root: Path) -> dict[str, int]:
    """Bytes of the files under each top-level entry of `root` (files at the top: by name)."""
    out: dict[str, int] = {}
    if not root.is_dir():
        return out
    for entry in root.iterdir():
        total = 0
        try:
            if entry.is_dir():
                for path in entry.rglob("*"):
                    # A file may go while we walk (a rotated archive file, a temp file).
                    with contextlib.suppress(OSError):
                        total += path.stat().st_size if path.is_file() else 0
            else:
                total = entry.stat().st_size
        except OSError:
            continue
        out[entry.name] = total
    return out


def scrape(url: str) -> dict[str, float]:
    """The METRICS samples of a Prometheus text page (those without labels)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as reply:
        text = reply.read().decode()
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in METRICS:
            out[name] = float(value)
    return out


# ---------------------------------------------------------------------------- analysis


def slope_per_hour(t: list[float], y: list[float]) -> float | None:
    """Least-squares slope of y against t (seconds), per hour; None under 3 points."""
    if len(t) < 3 or max(t) == min(t):
        return None
    mt, my = statistics.fmean(t), statistics.fmean(y)
    num = sum((a - mt) * (b - my) for a, b in zip(t, y, strict=True))
    den = sum((a - mt) ** 2 for a in t)
    return num / den * 3600.0


def rss_drift(t: list[float], rss: list[float]) -> dict[str, Any]:
    """How RSS moved after the warm-up, told apart from a line fitted through it: the
    slope within each full hour (a step then a plateau gives one steep hour and flat ones,
    a leak gives every hour the same slope), and the net change between the medians of the
    first and last 10 minutes (robust to the few-MB swings of single samples)."""
    if len(t) < 3:
        return {}
    points = list(zip(t, rss, strict=True))
    hours = []
    for start in range(int(t[0]), int(t[-1]) - 3599, 3600):
        inside = [(a, b) for a, b in points if start <= a <= start + 3600]
        slope = slope_per_hour([a for a, _ in inside], [b for _, b in inside])
        hours.append(_round(None if slope is None else slope / 1e6))
    first = statistics.median(b for a, b in points if a <= t[0] + 600.0) / 1e6
    last = statistics.median(b for a, b in points if a >= t[-1] - 600.0) / 1e6
    return {
        "slope_mb_per_h_by_hour": hours,
        "median_first_10min_mb": round(first, 2),
        "median_last_10min_mb": round(last, 2),
        "net_mb": round(last - first, 2),
        "net_mb_per_h": _round((last - first) * 3600.0 / (t[-1] - t[0])) if t[-1] > t[0] else None,
    }


def window_rates(samples: list[dict[str, Any]], start: float, stop: float) -> dict[str, Any]:
    """Frames/s, frames per daemon CPU-second and load in samples with start <= t <= stop."""
    inside = [s for s in samples if start <= s["t"] <= stop and "frames" in s]
    if len(inside) < 2:
        return {}
    a, b = inside[0], inside[-1]
    frames, seconds, cpu = b["frames"] - a["frames"], b["t"] - a["t"], b["cpu_s"] - a["cpu_s"]
    per_sample = [
        (y["frames"] - x["frames"]) / (y["t"] - x["t"])
        for x, y in itertools.pairwise(inside)
        if y["t"] > x["t"]
    ]
    return {
        "from_s": round(a["t"], 1),
        "to_s": round(b["t"], 1),
        "frames_per_s": round(frames / seconds, 1) if seconds > 0 else None,
        "frames_per_s_samples": _spread(per_sample),
        "frames_per_cpu_s": round(frames / cpu, 1) if cpu > 0 else None,
        "daemon_cpu_share": round(cpu / seconds, 3) if seconds > 0 else None,
        "load1": _spread([s["load"][0] for s in inside]),
    }


def _spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def analyse(samples: list[dict[str, Any]], warmup_s: float, caps: dict[str, int]) -> dict[str, Any]:
    """Slopes after the warm-up, the first and last frames/s windows, and the verdict."""
    after = [s for s in samples if s["t"] >= warmup_s]
    t = [s["t"] for s in after]
    series = {
        "rss_bytes": [s["rss_bytes"] for s in after],
        "rss_anon_bytes": [s["rss_anon_bytes"] for s in after],
        "fds": [s["fds"] for s in after],
        "threads": [s["threads"] for s in after],
        "children": [s["children"] for s in after],
        "state_dir_bytes": [s["state_dir_bytes"] for s in after],
        "records_bytes": [s["records_bytes"] for s in after],
        "log_bytes": [s["log_bytes"] for s in after],
    }
    slopes = {k: _round(slope_per_hour(t, v)) for k, v in series.items()}
    ranges = {k: [min(v), max(v)] if v else None for k, v in series.items()}
    end = samples[-1]["t"] if samples else 0.0
    span = max(0.0, end - warmup_s)
    width = min(600.0, span / 3)
    first = window_rates(samples, warmup_s, warmup_s + width)
    last = window_rates(samples, end - width, end)
    ratio = _ratio(last.get("frames_per_s"), first.get("frames_per_s"))
    cpu_ratio = _ratio(last.get("frames_per_cpu_s"), first.get("frames_per_cpu_s"))
    rss_mb_h = None if slopes["rss_bytes"] is None else slopes["rss_bytes"] / 1e6
    peak = {
        part: max((s["state_dir"].get(part, 0) for s in samples), default=0)
        for part in ("archive", "checkpoints")
    }
    verdict = {
        "rss_slope_mb_per_h": _round(rss_mb_h),
        "rss_flat": rss_mb_h is not None and rss_mb_h <= GOALS["rss_slope_mb_per_h"],
        "threads_constant": _constant(series["threads"]),
        "threads_steady": _steady(series["threads"]),
        "fds_constant": _constant(series["fds"]),
        "fds_steady": _steady(series["fds"]),
        "children_constant": _constant(series["children"]),
        "archive_peak_bytes": peak["archive"],
        "archive_within_cap": peak["archive"] <= caps["archive"],
        "checkpoints_peak_bytes": peak["checkpoints"],
        "checkpoints_within_cap": peak["checkpoints"] <= caps["checkpoints"],
        "frames_per_s_ratio": ratio,
        "frames_per_s_kept": ratio is not None and ratio >= GOALS["frames_per_s_ratio"],
        "frames_per_cpu_s_ratio": cpu_ratio,
    }
    verdict["passed"] = all(
        verdict[k]
        for k in (
            "rss_flat",
            "threads_steady",
            "fds_steady",
            "children_constant",
            "archive_within_cap",
            "checkpoints_within_cap",
            "frames_per_s_kept",
        )
    )
    return {
        "slopes_per_hour_after_warmup": slopes,
        "ranges_after_warmup": ranges,
        "rss_drift_after_warmup": rss_drift(t, series["rss_bytes"]),
        "windows": {"first": first, "last": last, "width_s": round(width, 1)},
        "verdict": verdict,
    }


def _constant(values: list[int]) -> bool:
    return bool(values) and min(values) == max(values)


def _steady(values: list[int], transient: int = 2) -> bool:
    """No growth: the second half's median is at most the first half's, and no sample is
    more than `transient` above it (a sample taken while a checkpoint temp file or a new
    archive file is open counts one fd more; that is no leak)."""
    half = len(values) // 2
    if half == 0:
        return False
    base = statistics.median(values[:half])
    return statistics.median(values[half:]) <= base and max(values) <= base + transient


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


# ---------------------------------------------------------------------------- the run


class SoakDaemon:
    """`navrl-daemon run` in a subprocess with its log in a file; the metrics URL once up."""

    def __init__(
        self, state: Path, log_path: Path, args: list[str], snapshots: Path | None, probe: str
    ):
        self.state = state
        self.log_path = log_path
        cmd = [sys.executable, "-m", "navrl_daemon", "run", "--state-dir", str(state), *args]
        if snapshots is not None:  # the same command, snapshots on SIGUSR1 (probed_child)
            cmd = [sys.executable, __file__, "--probed-child", str(snapshots), probe, *cmd[3:]]
        self._log = log_path.open("w")
        self.proc = subprocess.Popen(
            cmd, cwd=REPO, stderr=self._log, stdout=subprocess.DEVNULL, env=os.environ.copy()
        )
        self.url: str | None = None

    def wait_for_metrics(self, timeout_s: float = 600.0) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited {self.proc.returncode}: {self.log_tail()}")
            for line in self.log_path.read_text().splitlines():
                if '"metrics endpoint"' in line:
                    self.url = json.loads(line)["url"]
                    return self.url
            time.sleep(0.5)
        raise RuntimeError(f"no metrics endpoint after {timeout_s} s: {self.log_tail()}")

    def stop(self, timeout_s: float = 300.0) -> dict[str, Any]:
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._log.close()
        return {"exit_code": code, "stop_s": round(time.monotonic() - t0, 1)}

    def log_tail(self) -> str:
        return self.log_path.read_text()[-3000:]


def sample_once(
    daemon: SoakDaemon, probe: ProcessProbe, t0: float, records: tuple[str, ...]
) -> dict[str, Any]:
    """One sample: /proc first (our scrape adds a connection and a thread while it runs)."""
    row: dict[str, Any] = {"t": round(time.monotonic() - t0, 2), "load": os.getloadavg()}
    row |= probe.sample()
    parts = dir_bytes(daemon.state)
    row["state_dir"] = parts
    row["state_dir_bytes"] = sum(parts.values())
    row["records_bytes"] = sum(parts.get(name, 0) for name in records)
    row["log_bytes"] = daemon.log_path.stat().st_size
    if daemon.url is not None:
        try:
            m = scrape(daemon.url)
        except OSError as err:
            row["scrape_error"] = str(err)
        else:
            row["frames"] = int(m.get("navrl_frames_total", 0))
            row["iterations"] = int(m.get("navrl_iterations_total", 0))
            row["metrics"] = {k.removeprefix("navrl_"): v for k, v in m.items()}
    return row


def soak(
    *,
    minutes: float,
    warmup_min: float,
    interval_s: float,
    config: Path,
    overrides: list[str],
    workdir: Path,
    probe: str = "none",
) -> dict[str, Any]:
    """Run the daemon for `minutes`, sample it, stop it with SIGTERM; the JSON document."""
    sys.path.insert(0, str(REPO))
    from navrl_daemon.config import load_config  # the caps the verdict checks against

    args = ["--config", str(config), *BUSY, *overrides]
    cfg = load_config(config, [*BUSY, *overrides], environ={})
    kept_checkpoints(cfg.checkpoint)  # a config the checkpoint cap cannot hold: before the hour
    state, log_path = workdir / "state", workdir / "daemon.log"
    snapshots = workdir / "snapshots" if probe != "none" else None
    if snapshots is not None:
        snapshots.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    daemon = SoakDaemon(state, log_path, args, snapshots, probe)
    samples: list[dict[str, Any]] = []
    records = ("history.jsonl", "eval")
    try:
        daemon.wait_for_metrics()
        watched = ProcessProbe(daemon.proc.pid)
        warmup_s, end_s = warmup_min * 60.0, minutes * 60.0
        next_t = 0.0
        # Snapshots at the end of the warm-up (tracing starts), half-way and at the end.
        marks = [warmup_s, (warmup_s + end_s) / 2] if snapshots is not None else []
        while (now := time.monotonic() - t0) < end_s:
            if daemon.proc.poll() is not None:
                raise RuntimeError(f"daemon exited {daemon.proc.returncode}: {daemon.log_tail()}")
            if marks and now >= marks[0]:
                daemon.proc.send_signal(signal.SIGUSR1)
                marks.pop(0)
            if now >= next_t:
                samples.append(sample_once(daemon, watched, t0, records))
                next_t = now + interval_s
            time.sleep(min(1.0, max(0.05, next_t - now)))
        samples.append(sample_once(daemon, watched, t0, records))
        if snapshots is not None:
            daemon.proc.send_signal(signal.SIGUSR1)
            _wait_for_files(snapshots, 3)
    finally:
        stopped = daemon.stop()
    last = next((s["metrics"] for s in reversed(samples) if "metrics" in s), {})
    segments = last.get("archive_segments_total", 0)
    stored = last.get('archive_bytes_total{kind="stored"}', 0)
    rollout_bytes = int(stored * cfg.env.num_envs / segments) if segments else 0
    caps = configured_caps(cfg, rollout_bytes, state, log_path)
    doc: dict[str, Any] = {
        "benchmark": "soak",
        "minutes": minutes,
        "warmup_min": warmup_min,
        "interval_s": interval_s,
        "config": str(config),
        "overrides": [*BUSY, *overrides],
        "num_envs": cfg.env.num_envs,
        "frames_per_iteration": cfg.frames_per_iteration,
        "probe": probe,
        "caps_bytes": caps,
        "archive_rollout_stored_bytes": rollout_bytes,
        **stopped,
        "machine": {
            "cores": os.cpu_count(),
            "machine": platform.machine(),
            "python": platform.python_version(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "nice": os.nice(0),
        },
        "log": _log_census(log_path),
        **analyse(samples, warmup_min * 60.0, caps),
        "samples": samples,
    }
    if snapshots is not None:
        doc["malloc_info"] = [_malloc_totals(p) for p in sorted(snapshots.glob("malloc-*.xml"))]
    if probe == "tracemalloc":
        doc["tracemalloc"] = diff_snapshots(sorted(snapshots.glob("snap-*.bin")))  # type: ignore[union-attr]
    return doc


def configured_caps(cfg: Any, rollout_bytes: int, state: Path, log_path: Path) -> dict[str, int]:
    """What the archive and checkpoint directories may hold at most, by the config."""
    return {
        # One rollout of slack: rotation makes room before an append, from its size.
        "archive": cfg.archive.max_total_bytes + rollout_bytes,
        # keep_last files, keep_best older ones that scored best, and the one just written
        # before the oldest goes; the manifest. (The benchmark runs with keep_every = 0.)
        "checkpoints": kept_checkpoints(cfg.checkpoint) * largest_checkpoint(state, log_path)
        + (64 << 10),
    }


def kept_checkpoints(checkpoint: Any) -> int:
    """The most checkpoint files the writer's retention leaves at once, keep_every off."""
    if checkpoint.keep_every:
        raise SystemExit("soak: checkpoint.keep_every > 0 keeps files without bound; use 0")
    return checkpoint.keep_last + checkpoint.keep_best + 1


def largest_checkpoint(state: Path, log_path: Path) -> int:
    """Bytes of the largest checkpoint file of the run: the largest stored size the log
    reports plus a header (a file on disk's size less its logged stored size)."""
    stored = {}
    for line in log_path.read_text().splitlines():
        if '"checkpoint written"' in line:
            row = json.loads(line)
            stored[Path(row["path"]).name] = int(row["stored_bytes"])
    on_disk = [p for p in (state / "checkpoints").glob("ckpt-*.nrc") if p.name in stored]
    header = max((p.stat().st_size - stored[p.name] for p in on_disk), default=0)
    return max(stored.values(), default=0) + header


def reanalyse(path: Path, workdir: Path) -> dict[str, Any]:
    """An earlier run's document with its caps and analysis recomputed by this version."""
    sys.path.insert(0, str(REPO))
    from navrl_daemon.config import load_config

    doc = json.loads(path.read_text())
    cfg = load_config(Path(doc["config"]), doc["overrides"], environ={})
    rollout_bytes = doc["archive_rollout_stored_bytes"]
    caps = configured_caps(cfg, rollout_bytes, workdir / "state", workdir / "daemon.log")
    return {**doc, "caps_bytes": caps, **analyse(doc["samples"], doc["warmup_min"] * 60.0, caps)}


def _log_census(log_path: Path) -> dict[str, Any]:
    """Lines and bytes of the log by event name: what fills it."""
    counts: dict[str, list[int]] = {}
    for line in log_path.read_text().splitlines():
        try:
            event = json.loads(line).get("event", "?")
        except json.JSONDecodeError:
            event = "(not JSON)"
        c = counts.setdefault(event, [0, 0])
        c[0] += 1
        c[1] += len(line) + 1
    top = sorted(counts.items(), key=lambda kv: -kv[1][1])
    return {
        "bytes": log_path.stat().st_size,
        "lines": sum(c[0] for c in counts.values()),
        "by_event": {k: {"lines": c[0], "bytes": c[1]} for k, c in top[:12]},
    }


def _wait_for_files(directory: Path, count: int, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(list(directory.glob("malloc-*.xml"))) < count and time.monotonic() < deadline:
        time.sleep(0.5)


def _malloc_totals(path: Path) -> dict[str, int]:
    """glibc's malloc_info totals: what its arenas hold from the system, what of that is
    free in its bins (fragmentation when it grows), and the bytes of mmapped chunks."""
    import xml.etree.ElementTree as ET

    root = ET.parse(path).getroot()
    out = {"arenas": len(root.findall("heap"))}
    for node in root:  # the totals over all arenas follow the per-arena <heap> elements
        if node.tag == "heap":
            continue
        kind = node.get("type")
        if node.tag == "total" and kind in ("fast", "rest", "mmap"):
            out[f"{kind}_bytes"] = int(node.get("size", 0))
        elif node.tag == "system" and kind in ("current", "max"):
            out[f"system_{kind}_bytes"] = int(node.get("size", 0))
    return out


# ---------------------------------------------------------------------------- tracemalloc


def probed_child(snapshots: Path, probe: str, argv: list[str]) -> int:
    """The daemon's CLI; each SIGUSR1 writes glibc's malloc_info and, with probe
    "tracemalloc", a tracemalloc snapshot to `snapshots`. Tracing starts at the first one
    (the end of the warm-up): imports and warm-up are not traced and run at full speed."""
    import ctypes

    sys.path.insert(0, str(REPO))
    from navrl_daemon.cli import main

    libc = ctypes.CDLL("libc.so.6")
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    taken = [0]

    def dump(signum: int, frame: Any) -> None:
        if probe == "tracemalloc":
            if not tracemalloc.is_tracing():
                tracemalloc.start(12)
            path = snapshots / f"snap-{taken[0]}.bin"
            tracemalloc.take_snapshot().dump(str(path) + ".tmp")
            os.replace(str(path) + ".tmp", path)
        xml = snapshots / f"malloc-{taken[0]}.xml"
        fh = libc.fopen(str(xml).encode() + b".tmp", b"w")
        libc.malloc_info(0, fh)
        libc.fclose(fh)
        os.replace(str(xml) + ".tmp", xml)
        taken[0] += 1

    signal.signal(signal.SIGUSR1, dump)
    trim_s = float(os.environ.get("SOAK_MALLOC_TRIM_S", "0"))
    if trim_s > 0:  # an experiment: does giving freed heap back keep RSS flat?
        libc.malloc_trim.argtypes = [ctypes.c_size_t]

        def trim() -> None:
            while True:
                time.sleep(trim_s)
                libc.malloc_trim(0)

        threading.Thread(target=trim, name="malloc-trim", daemon=True).start()
    return main(argv)


def diff_snapshots(paths: list[Path], top: int = 15) -> dict[str, Any]:
    """What grew between the last two snapshots (both traced: the first one only starts
    tracing), by allocation site, largest growth first."""
    if len(paths) < 3:
        return {"error": f"{len(paths)} snapshot(s) taken"}
    old, new = (tracemalloc.Snapshot.load(str(p)) for p in (paths[-2], paths[-1]))
    skip = [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<*>")]
    old, new = old.filter_traces(skip), new.filter_traces(skip)
    stats = new.compare_to(old, "traceback")
    grown = sorted((s for s in stats if s.size_diff > 0), key=lambda s: -s.size_diff)
    return {
        "traced_bytes": [sum(s.size for s in x.statistics("filename")) for x in (old, new)],
        "grown": [
            {
                "size_diff_bytes": s.size_diff,
                "count_diff": s.count_diff,
                "size_bytes": s.size,
                "where": _where(s.traceback),
            }
            for s in grown[:top]
        ],
    }


def _where(tb: tracemalloc.Traceback) -> list[str]:
    """The frames of a traceback, innermost first, as file:line, up to the daemon's own."""
    out = []
    for frame in reversed(tb):  # most recent call first
        name = re.sub(r".*/(site-packages|lib/python[\d.]+)/", "", frame.filename)
        name = name.replace(str(REPO) + "/", "")
        out.append(f"{name}:{frame.lineno}")
        if name.startswith("navrl_daemon/") and len(out) > 1:
            break
    return out[:8]


# ---------------------------------------------------------------------------- CLI


def main() -> None:
    if len(sys.argv) > 3 and sys.argv[1] == "--probed-child":
        raise SystemExit(probed_child(Path(sys.argv[2]), sys.argv[3], sys.argv[4:]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--warmup-min", type=float, default=5.0)
    ap.add_argument("--interval-s", type=float, default=10.0)
    ap.add_argument("--config", type=Path, default=REPO / "config" / "default.toml")
    ap.add_argument("--out", type=Path, help="also write the JSON here")
    ap.add_argument("--workdir", type=Path, help="keep state dir and log here (default: temp)")
    ap.add_argument(
        "--probe",
        choices=["none", "malloc", "tracemalloc"],
        default="none",
        help="snapshots at the warm-up's end, half-way and the end: glibc's malloc_info "
        "(malloc), and Python allocations diffed by site (tracemalloc)",
    )
    ap.add_argument(
        "--reanalyse",
        type=Path,
        metavar="JSON",
        help="recompute caps and verdict of an earlier run's JSON (its --workdir kept)",
    )
    ap.add_argument("overrides", nargs="*", help="KEY=VALUE after the soak's own")
    args = ap.parse_args()
    if args.reanalyse is not None:
        print(json.dumps(reanalyse(args.reanalyse, args.workdir), indent=1))
        return
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        doc = soak(
            minutes=args.minutes,
            warmup_min=args.warmup_min,
            interval_s=args.interval_s,
            config=args.config,
            overrides=args.overrides,
            workdir=workdir,
            probe=args.probe,
        )
    text = json.dumps(doc, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
