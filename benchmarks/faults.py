"""Faults under a running daemon: what training does while they last, and what is lost. JSON out.

Each scenario starts a real `navrl-daemon run` (config/default.toml at 16 envs, a progress
line every 2 iterations), measures training frames/s from its progress lines before the
fault (the baseline), during it and after it is gone, then stops the daemon with SIGTERM
and checks what a user relies on: exit code, the final checkpoint (valid, of the last
trained iteration), the eval results file (no torn or missing rows), the export.

- `full_disk`: the state dir on an 8 MB tmpfs (mount needs root; skipped with the reason
  where it is not permitted), filled completely by another file during the run, then freed.
- `idle_connections`: 1,000 TCP connections to the metrics port opened and held idle, the
  daemon under a 1024 open-file soft limit (systemd's default); a scrape is tried meanwhile.
- `deleted_lock`: `STATE/lock` deleted while the daemon runs, then a second daemon started
  on the same state dir; whether it is refused (exit 75) or writes checkpoints there too.
- `index_corruption`: a daemon archiving every rollout is stopped, one high bit of the
  newest archive file's last index row flipped (`iteration ^= 1 << 40`), and the daemon
  started again: where it says the archive ends, whether it archives on, /metrics.
- `connection_churn`: 1,000 idle connections to /metrics (the daemon under a 1024
  open-file soft limit) closed all at once, then 64 sockets reconnecting in a loop
  (closing at once, mid-request, after a request, with a reset); whether /metrics and
  /healthz still answer and training goes on.
- `misnamed_checkpoint`: after a run, `ln -s ckpt-<oldest>.nrc ckpt-999999999.nrc` and a
  copy of the oldest under the next iteration's name; the restart must resume from the true
  newest, keep the history, and reject both files.
- `oversize_claim`: a checkpoint of under 300 bytes, its checksum right, whose LZ4 frame
  claims 2**60 decoded bytes, put among a running daemon's checkpoints and again before a
  restart; `checkpoints verify` must exit 65 naming it, `run` resume past it.
- `startup_signal`: SIGTERM to 20 daemons in turn, each at a random moment of its start-up
  (0.05 to 3 s after spawn) on one state dir; every exit must be 0 or a documented code,
  never an abort or a traceback; then a daemon that trains and answers /metrics there.
  `--startup-signals N [--budget-s S]` runs this scenario alone with N signals.

- `security`: crafted inputs (functions listed in CRAFTED; configs: TOML nested 500 deep,
  a checkpoint and a state dir naming a module as the env backend), each with its command
  run as `python -m navrl_daemon` from a folder holding a module that marks its import,
  and the exit code it must get; no traceback, no marker, and the newest valid
  checkpoint of a small run still resumes afterwards.

The last five run at small sizes (8 envs, short episodes): they check what survives,
not frames/s. Each result's `tracebacks`, `iterations_lost` and `scrape_after` say
whether the daemon came through.

A scenario that fails is reported with its error; the others still run. Ratios are
during/before and after/before of the median frames/s of each phase (spread: min, max).

Run: `.venv/bin/python benchmarks/faults.py [--scenarios full_disk,idle_connections,...]`
or `.venv/bin/python benchmarks/faults.py --startup-signals 500 [--budget-s S] [--max-delay-s 3]`
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import platform
import random
import resource
import selectors
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from navrl_daemon.testing import TINY  # noqa: E402
from navrl_daemon.testing.full_disk import fill  # noqa: E402

BASE = [
    "--config",
    "config/default.toml",
    "run.device=cpu",
    "env.num_envs=16",
    "run.total_frames=1000000000",
    "log.summary_interval=2",
    "log.format=json",
    "eval.interval=4",
    "checkpoint.interval=2",
    "metrics.address=127.0.0.1",
]
# Sizes of the small scenarios: the tests' TINY on this run's device, a checkpoint every
# iteration; later overrides win (each scenario's metrics.port).
SMALL = [*(o for o in TINY if not o.startswith("run.device=")), "checkpoint.interval=1"]
# Exit codes the docs give `run` (docs/operations.md): 0 stopped or finished, 65 invalid
# data, 70 start-up timed out, 75 state dir locked, 78 configuration.
DOCUMENTED_EXITS = (0, 65, 70, 75, 78)
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
PHASE_LINES = 3  # progress lines per phase
PHASE_TIMEOUT_S = 240.0


class LoggedDaemon:
    """A `navrl-daemon run` whose JSON log lines are collected, with arrival times."""

    def __init__(self, state: Path, *overrides: str, nofile: int | None = None) -> None:
        def limits() -> None:
            if nofile is not None:
                hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard))

        command = [sys.executable, "-m", "navrl_daemon", "run", "--state-dir", str(state)]
        self.proc = subprocess.Popen(
            [*command, *BASE, *overrides],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
            preexec_fn=limits,
        )
        self.events: list[tuple[float, dict[str, Any]]] = []
        self.other: list[str] = []  # stderr lines that are not JSON (a traceback)
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            try:
                event = json.loads(line)
            except ValueError:
                self.other.append(line.rstrip())
                continue
            with self._cond:
                self.events.append((time.monotonic(), event))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait(self, predicate: Callable[[dict[str, Any]], bool], count: int, timeout: float) -> int:
        """Wait until `count` events after now satisfy `predicate`; returns how many did."""
        deadline = time.monotonic() + timeout
        with self._cond:
            start = len(self.events)
            while True:
                seen = sum(predicate(e) for _, e in self.events[start:])
                if seen >= count or self.proc.poll() is not None:
                    return seen
                left = deadline - time.monotonic()
                if left <= 0:
                    return seen
                self._cond.wait(min(left, 1.0))

    def progress(self, count: int = PHASE_LINES, timeout: float = PHASE_TIMEOUT_S) -> int:
        return self.wait(lambda e: e.get("event") == "progress", count, timeout)

    def named(self, name: str, since: float = 0.0) -> list[dict[str, Any]]:
        return [e for t, e in self.events if t >= since and e.get("event", "").startswith(name)]

    def fps(self, start: float, stop: float) -> list[float]:
        return [
            float(e["frames_per_second"])
            for t, e in self.events
            if start <= t < stop and e.get("event") == "progress"
        ]

    def stop(self, timeout: float = 180.0) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._reader.join(timeout=10)
        return code


def phase(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"lines": 0, "median": None}
    return {
        "lines": len(values),
        "median": round(statistics.median(values), 1),
        "min": round(min(values), 1),
        "max": round(max(values), 1),
    }


def phases(d: LoggedDaemon, marks: list[float]) -> dict[str, Any]:
    """Frames/s before, during and after the fault (marks: start, fault, cleared, end)."""
    names = ("before", "during", "after")
    out = {n: phase(d.fps(a, b)) for n, a, b in zip(names, marks, marks[1:], strict=False)}
    base = out["before"]["median"]
    for n in ("during", "after"):
        median = out[n]["median"]
        out[f"{n}_over_before"] = round(median / base, 3) if base and median else None
    return out


def losses(d: LoggedDaemon, state: Path, code: int | None) -> dict[str, Any]:
    """What a user relies on after the stop: exit 0, a final checkpoint of the last trained
    iteration, every evaluation in eval/results.jsonl, the export."""
    from navrl_daemon.storage.checkpoint import CheckpointDir, read_header, verify
    from navrl_daemon.storage.history import read_jsonl

    trained = [e["iteration"] for e in d.named("progress")]
    stopped_at = [e.get("iteration", 0) for e in d.named("policy export")]
    written = [e.get("iteration", 0) for e in d.named("checkpoint written")]
    last_iteration = max(written + stopped_at + trained + [0])
    files = CheckpointDir(state / "checkpoints").files()
    valid = [p for p, why in verify(files) if why is None]
    newest = read_header(valid[-1]).iteration if valid else None
    # the event itself: "evaluation stopped: shutting down" has no result to write
    evaluated = [e["iteration"] for _, e in d.events if e.get("event") == "evaluation"]
    rows = read_jsonl(state / "eval" / "results.jsonl")
    with tempfile.TemporaryDirectory(prefix="faults-report-") as out:
        report_args = ["report", "--state-dir", str(state), "--no-trajectories", "--out", out]
        report = subprocess.run(
            [sys.executable, "-m", "navrl_daemon", *report_args],
            cwd=REPO,
            capture_output=True,
            text=True,
            env=ENV,
            timeout=300,
        )
    return {
        "exit_code": code,
        "traceback": any("Traceback" in line for line in d.other),
        "tracebacks": sum("Traceback" in line for line in d.other),
        "error_events": [e.get("event") for _, e in d.events if e.get("level") == "error"][:5],
        "stage_failed": [line for line in d.other if "failed" in line][:3],
        "newest_valid_checkpoint": newest,
        "last_iteration": last_iteration,
        "iterations_lost": None if newest is None else last_iteration - newest,
        "checkpoint_write_failures": len(d.named("checkpoint write failed")),
        "invalid_checkpoint_files": len(files) - len(valid),
        "evaluations": len(evaluated),
        "evaluation_rows": len(rows.rows),
        "evaluation_rows_missing": len(set(evaluated) - {r.get("iteration") for r in rows.rows}),
        "bad_lines": len(rows.bad) + len(read_jsonl(state / "history.jsonl").bad),
        "report_exit_code": report.returncode,
        "export_failed": bool(d.named("policy export failed")),
    }


# ---------------------------------------------------------------------------- scenarios


def full_disk(tmp: Path) -> dict[str, Any]:
    disk = tmp / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        return {"skipped": f"cannot mount a tmpfs: {mounted.stderr.strip()}"}
    try:
        state = disk / "state"
        d = LoggedDaemon(state, "checkpoint.interval=1", "metrics.port=0")
        t0 = time.monotonic()
        d.progress(PHASE_LINES + 1)  # the first window includes start-up
        t1 = time.monotonic()
        filler = fill(disk)
        during = d.progress()
        t2 = time.monotonic()
        filler.unlink()
        d.progress()
        t3 = time.monotonic()
        code = d.stop()
        result = {
            "phases": phases(d, [t0, t1, t2, t3]),
            "progress_lines_while_full": during,
            "low_space_removals": len(d.named("low disk space")),
            "eval_rows_waited": len(d.named("evaluation result not written")),
            **losses(d, state, code),
        }
        return result
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def open_idle(port: int, count: int, timeout: float = 20.0) -> tuple[list[socket.socket], int]:
    """Open `count` connections without sending a byte; returns the sockets and how many
    were established within `timeout`."""
    socks, sel = [], selectors.DefaultSelector()
    for _ in range(count):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        socks.append(s)
        sel.register(s, selectors.EVENT_WRITE)
    established, deadline = 0, time.monotonic() + timeout
    while established < count and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=0.5):
            sel.unregister(key.fileobj)
            if key.fileobj.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:  # type: ignore[union-attr]
                established += 1
    sel.close()
    return socks, established


def scrape(port: int, timeout: float = 10.0, path: str = "/metrics") -> dict[str, Any]:
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            r.read()
            return {"ok": r.status == 200, "seconds": round(time.monotonic() - t0, 3)}
    except urllib.error.HTTPError as err:  # an answer all the same (/healthz: 503 = stale)
        return {"ok": False, "status": err.code, "seconds": round(time.monotonic() - t0, 3)}
    except Exception as err:  # the point is to see how it fails
        return {"ok": False, "error": f"{type(err).__name__}: {err}"}


def endpoints(port: int) -> dict[str, Any]:
    return {"metrics": scrape(port), "healthz": scrape(port, path="/healthz")}


def restart_small(state: Path) -> tuple[LoggedDaemon, dict[str, Any], int | None]:
    """A SMALL daemon started again on `state` until it has trained a few iterations: it,
    what /metrics and /healthz answered then, and its exit code once stopped."""
    port = free_port()
    d = LoggedDaemon(state, *SMALL, f"metrics.port={port}")
    d.progress(PHASE_LINES)
    scrape_after = endpoints(port)
    return d, scrape_after, d.stop()


def raise_nofile(wanted: int) -> None:
    """This process's open-file soft limit to at least `wanted` (up to the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, wanted), hard))


def idle_connections(tmp: Path, count: int = 1000) -> dict[str, Any]:
    raise_nofile(4 * count + 256)
    port = free_port()
    state = tmp / "state"
    d = LoggedDaemon(state, f"metrics.port={port}", nofile=1024)
    t0 = time.monotonic()
    d.progress(PHASE_LINES + 1)
    before_scrape = scrape(port)
    t1 = time.monotonic()
    socks, established = open_idle(port, count)
    try:
        during = d.progress()
        during_scrape = scrape(port)
        failures_during = len(d.named("checkpoint write failed", since=t1))
    finally:
        t2 = time.monotonic()
        for s in socks:
            s.close()
    d.progress()
    after_scrape = scrape(port)
    t3 = time.monotonic()
    code = d.stop()
    return {
        "connections": count,
        "established": established,
        "daemon_nofile_soft_limit": 1024,
        "phases": phases(d, [t0, t1, t2, t3]),
        "progress_lines_while_held": during,
        "checkpoint_write_failures_while_held": failures_during,
        "scrape_before": before_scrape,
        "scrape_during": during_scrape,
        "scrape_after": after_scrape,
        **losses(d, state, code),
    }


def deleted_lock(tmp: Path) -> dict[str, Any]:
    from navrl_daemon.storage.checkpoint import CheckpointDir, verify

    state = tmp / "state"
    a = LoggedDaemon(state, "metrics.port=0")
    t0 = time.monotonic()
    a.progress(PHASE_LINES + 1)
    t1 = time.monotonic()
    (state / "lock").unlink()
    b = LoggedDaemon(state, "metrics.port=0", "env.num_envs=32")
    b.wait(lambda e: e.get("event") in ("progress", "stopped"), 2, PHASE_TIMEOUT_S)
    b_running = b.proc.poll() is None
    during = a.progress()
    b_code = b.stop() if b_running else b.proc.returncode
    t2 = time.monotonic()
    a.progress()
    t3 = time.monotonic()
    code = a.stop()
    files = CheckpointDir(state / "checkpoints").files()
    return {
        "second_daemon_exit_code": b_code,
        "second_daemon_trained": len(b.named("progress")) > 0,
        "second_daemon_refused": b_code == 75 and not b_running,
        "second_daemon_checkpoints_written": len(b.named("checkpoint written")),
        "second_daemon_message": (b.other[-1] if b.other else None),
        "phases": phases(a, [t0, t1, t2, t3]),
        "progress_lines_meanwhile": during,
        "checkpoint_files_after": len(files),
        "checkpoints_valid_after": sum(why is None for _, why in verify(files)),
        **losses(a, state, code),
    }


def index_corruption(tmp: Path) -> dict[str, Any]:
    import h5py

    from navrl_daemon.storage.archive import ArchiveFile, archive_files, last_archived_iteration

    state = tmp / "state"
    archiving = ("archive.interval=1", "archive.on_full=block")
    first = LoggedDaemon(state, *archiving, "metrics.port=0")
    first.progress(PHASE_LINES)
    first_code = first.stop()
    newest = archive_files(state / "archive")[-1]
    with ArchiveFile.open(newest) as f:
        truly_through = int(f.rows["iteration"].max())
        row = f.segments - 1
    with h5py.File(newest, "r+") as f:
        f["index/iteration"][row] ^= 1 << 40
    seen_through = last_archived_iteration(state / "archive")  # what the restart computes
    port = free_port()
    d = LoggedDaemon(state, *archiving, f"metrics.port={port}")
    t0 = time.monotonic()
    d.progress(PHASE_LINES)
    scrape_after = scrape(port)
    t1 = time.monotonic()
    code = d.stop()
    start = d.named("archive holds rollouts")
    archived: set[int] = set()
    for path in archive_files(state / "archive"):
        if path.name > newest.name:  # written by the restarted daemon
            with ArchiveFile.open(path) as f:
                archived |= set(f.rows["iteration"].tolist())
    return {
        "first_exit_code": first_code,
        "flipped": {"file": newest.name, "row": row, "iteration": truly_through},
        "archived_through_true": truly_through,
        "archived_through_at_restart": seen_through,
        "archived_through_logged": start[0]["archived_through"] if start else None,
        "damage_logged": [e.get("error") for e in d.named("archive damaged")][:2],
        "rollouts_called_already_archived": len(d.named("rollout already archived")),
        "rollouts_archived_after_restart": len(archived),
        "frames_per_second": phase(d.fps(t0, t1)),
        "scrape_after": scrape_after,
        **losses(d, state, code),
    }


def newest_iteration(d: LoggedDaemon) -> int:
    return max([e["iteration"] for e in d.named("progress")] + [0])


def churn(port: int, sockets: int, seconds: float) -> dict[str, int]:
    """`sockets` clients connecting to /metrics in a loop for `seconds`, each connection
    ended one of four ways in turn: closed at once, mid-request, after a whole request
    without reading the answer, or reset (SO_LINGER 0)."""
    request = b"GET /metrics HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n"
    endings = ("at once", "mid-request", "after the request", "reset")
    counts = [collections.Counter[str]() for _ in range(sockets)]
    stop = time.monotonic() + seconds

    def loop(counter: collections.Counter[str]) -> None:
        n = 0
        while time.monotonic() < stop:
            ending = endings[n % len(endings)]
            n += 1
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=2.0) as s:
                    if ending == "mid-request":
                        s.sendall(request[:9])
                    elif ending == "after the request":
                        s.sendall(request)
                    elif ending == "reset":
                        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                counter[ending] += 1
            except OSError as err:
                counter[f"failed: {type(err).__name__}"] += 1
            time.sleep(0.005)  # a reconnect loop, not a CPU burner: the daemon shares the cores

    threads = [threading.Thread(target=loop, args=(c,), daemon=True) for c in counts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return dict(sum(counts, collections.Counter[str]()))


def connection_churn(tmp: Path, idle: int = 1000, sockets: int = 64) -> dict[str, Any]:
    raise_nofile(2 * idle + 4 * sockets + 256)
    port = free_port()
    state = tmp / "state"
    d = LoggedDaemon(state, *SMALL, f"metrics.port={port}", nofile=1024)
    d.progress(PHASE_LINES)
    before = endpoints(port)
    socks, established = open_idle(port, idle)
    d.progress(PHASE_LINES)
    for s in socks:  # all together, as a load balancer dropping its pool does
        s.close()
    after_close = endpoints(port)
    iteration_before_churn = newest_iteration(d)
    churned = churn(port, sockets, seconds=15.0)
    d.progress(PHASE_LINES)
    after = endpoints(port)
    iteration_after = newest_iteration(d)
    code = d.stop()
    return {
        "idle_connections": idle,
        "established": established,
        "daemon_nofile_soft_limit": 1024,
        "churn_sockets": sockets,
        "churn_connections": churned,
        "scrape_before": before,
        "scrape_after_idle_closed": after_close,
        "scrape_after": after,
        "iteration_before_churn": iteration_before_churn,
        "iteration_after_churn": iteration_after,
        "metrics_thread_died": any("metrics-http" in line for line in d.other),
        **losses(d, state, code),
    }


def misnamed_checkpoint(tmp: Path) -> dict[str, Any]:
    from navrl_daemon.storage.checkpoint import REJECTED, CheckpointDir, read_header
    from navrl_daemon.storage.history import read_jsonl

    state = tmp / "state"
    first = LoggedDaemon(state, *SMALL, "metrics.port=0")
    first.progress(8)
    first_code = first.stop()
    checkpoints = state / "checkpoints"
    files = CheckpointDir(checkpoints).files()
    oldest, newest = files[0], read_header(files[-1]).iteration
    link = checkpoints / "ckpt-999999999.nrc"
    link.symlink_to(oldest.name)
    copy = checkpoints / f"ckpt-{newest + 1:09d}.nrc"
    shutil.copyfile(oldest, copy)
    history_before = {r.get("iteration") for r in read_jsonl(state / "history.jsonl").rows}

    d, scrape_after, code = restart_small(state)
    resumed = d.named("resumed from checkpoint")
    resumed_at = resumed[0]["iteration"] if resumed else None
    history_after = {r.get("iteration") for r in read_jsonl(state / "history.jsonl").rows}
    rejected = checkpoints / REJECTED
    return {
        "first_exit_code": first_code,
        "newest_before_restart": newest,
        "planted": {link.name: f"symlink to {oldest.name}", copy.name: f"copy of {oldest.name}"},
        "resumed_from": resumed_at,
        "resumed_from_file": Path(resumed[0]["path"]).name if resumed else None,
        "went_back": resumed_at is None or resumed_at < newest,
        "skipped": [
            {"file": Path(e["file"]).name, "reason": e.get("reason")}
            for e in d.named("skipping invalid checkpoint")
        ],
        "rejected_files": sorted(p.name for p in rejected.iterdir()) if rejected.is_dir() else [],
        "history_rows_lost": len(history_before - history_after),
        "first_iteration_after_restart": min(
            [e["iteration"] for e in d.named("progress")], default=None
        ),
        "scrape_after": scrape_after,
        **losses(d, state, code),
    }


def oversize_claim_file(iteration: int) -> bytes:
    """A checkpoint of under 300 bytes for `iteration`, its checksum right, whose one LZ4
    frame claims 2**60 decoded bytes (the container is the corpus's, so that nothing in the
    writer refuses it)."""
    import lz4.frame

    from navrl_daemon.testing.crafted_files import nrc_container

    raw = b"x" * 200
    frame = lz4.frame.LZ4FrameCompressor(auto_flush=True)
    payload = frame.begin(source_size=2**60) + frame.compress(raw) + b"\\0\\0\\0\\0"
    return nrc_container(raw, iteration, payload=payload)


def verify_cli(*args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "navrl_daemon", "checkpoints", "verify", "--json", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    try:
        invalid = [(Path(r["path"]).name, r["reason"]) for r in json.loads(done.stdout)]
    except ValueError:
        invalid = []
    return {
        "exit_code": done.returncode,
        "invalid": [{"file": name, "reason": why} for name, why in invalid if why],
        "traceback": "Traceback" in done.stderr,
        "memory_error": "MemoryError" in done.stderr + done.stdout,
    }


def oversize_claim(tmp: Path) -> dict[str, Any]:
    from navrl_daemon.storage.checkpoint import REJECTED

    state = tmp / "state"
    checkpoints = state / "checkpoints"
    port = free_port()
    first = LoggedDaemon(state, *SMALL, f"metrics.port={port}")
    first.progress(PHASE_LINES)
    running = checkpoints / f"ckpt-{10**6:09d}.nrc"  # newer than anything the run writes
    running.write_bytes(oversize_claim_file(10**6))
    size = running.stat().st_size
    outside = tmp / "outside" / running.name  # a copy the daemon does not move aside
    outside.parent.mkdir()
    outside.write_bytes(running.read_bytes())
    while_running = first.progress(PHASE_LINES)
    scrape_while_running = endpoints(port)
    # the whole dir as well: the run prunes a checkpoint every iteration meanwhile
    verify_dir_while_running = verify_cli("--state-dir", str(state))
    verify_file = verify_cli(str(outside))
    first_code = first.stop()
    written = max(e["iteration"] for e in first.named("checkpoint written"))

    before_restart = checkpoints / f"ckpt-{10**6 + 1:09d}.nrc"
    before_restart.write_bytes(oversize_claim_file(10**6 + 1))
    verify_before_restart = verify_cli(str(before_restart))
    d, scrape_after, code = restart_small(state)
    resumed = d.named("resumed from checkpoint")
    rejected = checkpoints / REJECTED
    logs = first.other + d.other + [json.dumps(e) for _, e in first.events + d.events]
    return {
        "crafted_bytes": size,
        "first_exit_code": first_code,
        "progress_lines_after_planting": while_running,
        "first_daemon_tracebacks": sum("Traceback" in line for line in first.other),
        "scrape_while_running": scrape_while_running,
        "verify_crafted_file": verify_file,
        "verify_state_dir_while_running": verify_dir_while_running,
        "running_daemon_on_it": [
            {k: e.get(k) for k in ("event", "level", "reason") if k in e}
            for _, e in first.events
            if running.name in json.dumps(e)
        ][:3],
        "verify_before_restart": verify_before_restart,
        "newest_written_before_restart": written,
        "resumed_from": resumed[0]["iteration"] if resumed else None,
        "skipped": [
            {"file": Path(e["file"]).name, "reason": e.get("reason")}
            for e in d.named("skipping invalid checkpoint")
        ],
        "rejected_files": sorted(p.name for p in rejected.iterdir()) if rejected.is_dir() else [],
        "memory_error": any("MemoryError" in line for line in logs),
        "scrape_after": scrape_after,
        **losses(d, state, code),
    }


def documented_stop(code: int | None, printed: bool) -> bool:
    """A stop signal's exit as docs/operations.md gives it: a documented code, or -15 with
    nothing logged or printed (a signal before `main`: Python's default action)."""
    return code in DOCUMENTED_EXITS or (code == -signal.SIGTERM and not printed)


def startup_signal(
    tmp: Path,
    count: int = 20,
    seed: int = 0,
    budget_s: float | None = None,
    max_delay_s: float = 3.0,
) -> dict[str, Any]:
    """SIGTERM to `count` daemons in turn, each 0.05 to `max_delay_s` s after it was spawned,
    on one state dir (later ones resume); stops early, saying so, once `budget_s` is spent.
    Where each start-up was when stopped: before its first log line (imports), after it
    (config, lock), after the last start-up phase it logged, or trained."""
    rng = random.Random(seed)
    state = tmp / "state"
    deadline = None if budget_s is None else time.monotonic() + budget_s
    exits: collections.Counter[int | None] = collections.Counter()
    phases_reached: collections.Counter[str] = collections.Counter()
    bad, sent = [], 0
    while sent < count and (deadline is None or time.monotonic() < deadline):
        delay = rng.uniform(0.05, max_delay_s)
        d = LoggedDaemon(state, *SMALL, "metrics.port=0")
        time.sleep(delay)
        exited_first = d.proc.poll() is not None
        code = d.stop()
        sent += 1
        exits[code] += 1
        reached = [f"after {e.get('phase')}" for e in d.named("start-up phase")]
        logged = "after the first log line" if d.events else "before the first log line"
        phases_reached["trained" if d.named("progress") else (reached or [logged])[-1]] += 1
        aborted = [line for line in d.other if "Traceback" in line or "terminate" in line]
        if not documented_stop(code, bool(d.events or d.other)) or aborted or exited_first:
            first = next((i for i, line in enumerate(d.other) if "Traceback" in line), -8)
            log = d.other[first:][:40]
            bad.append({"signal": sent, "delay_s": round(delay, 3), "exit_code": code, "log": log})
    d, scrape_after, code = restart_small(state)
    return {
        "signals_requested": count,
        "signals_sent": sent,
        "seed": seed,
        "delay_s": [0.05, max_delay_s],
        "exit_codes": {str(k): v for k, v in sorted(exits.items(), key=str)},
        "undocumented_or_traceback": len(bad),
        "aborts": exits[-signal.SIGABRT] + exits[134],
        # the default action: a signal before the interpreter ran `main` and its handler
        # (documented; "bad" only where something was logged or printed first)
        "killed_by_sigterm": exits[-signal.SIGTERM],
        "last_phase_when_stopped": dict(phases_reached),
        "bad": bad[:10],
        "scrape_after": scrape_after,
        **losses(d, state, code),
    }


# ------------------------------------------------- security: crafted files and their exits
# Each crafted input with the command that reads it and the exit code it must get. One
# function per kind of input returns its cases (CRAFTED lists them); `security` runs every
# case from the folder that holds a module which writes a marker file when imported, then
# checks that no case printed a traceback or wrote the marker, and that the state dir's
# newest valid checkpoint still resumes.


@dataclass(frozen=True)
class Crafted:
    name: str
    args: list[str]  # navrl-daemon's arguments
    expected: int  # its exit code


def crafted_config_cases(tmp: Path, state: Path) -> list[Crafted]:
    """Configs: TOML 500 inline tables or arrays deep, in a file and in an override; a
    checkpoint, and a copy of the trained state dir, whose stored config names a module
    as `env.backend` (navrl_daemon/testing/crafted_config.py)."""
    from navrl_daemon.testing.crafted_config import (
        BACKEND,
        checkpoint_naming,
        nested_toml,
        run_config_naming,
    )

    deep = tmp / "deep.toml"
    deep.write_text(f"[env]\noptions = {{x = {nested_toml('table', 500)}}}\n")
    shared = checkpoint_naming(tmp / "shared" / "ckpt.nrc", BACKEND)
    copied = Path(shutil.copytree(state, tmp / "copied-state"))
    run_config_naming(copied, BACKEND)
    return [
        Crafted("toml_500_tables_file", ["run", "--config", str(deep), *SMALL], 78),
        Crafted(
            "toml_500_arrays_override",
            ["config", "show", f"env.options.x={nested_toml('array', 500)}"],
            78,
        ),
        Crafted("checkpoint_backend_module", ["eval", "--checkpoint", str(shared)], 78),
        Crafted("state_dir_backend_module", ["eval", "--state-dir", str(copied)], 78),
        Crafted("state_dir_backend_module_report", ["report", "--state-dir", str(copied)], 0),
    ]


CRAFTED: list[Callable[[Path, Path], list[Crafted]]] = [crafted_config_cases]


def navrl(args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`python -m navrl_daemon ARGS` from `cwd`, which is then on its import path."""
    command = [sys.executable, "-m", "navrl_daemon", *args]
    return subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, env=ENV, timeout=timeout
    )


def security(tmp: Path) -> dict[str, Any]:
    from navrl_daemon.storage.checkpoint import CheckpointDir, read_header, verify
    from navrl_daemon.testing.crafted_config import plant_module

    state = tmp / "state"
    marker = plant_module(tmp)
    first = navrl(["run", "--state-dir", str(state), *SMALL, "run.total_frames=192"], tmp)
    valid = [p for p, why in verify(CheckpointDir(state / "checkpoints").files()) if why is None]
    newest = read_header(valid[-1]).iteration if valid else None
    cases = []
    for make in CRAFTED:
        for case in make(tmp, state):
            done = navrl(case.args, tmp)
            cases.append(
                {
                    "name": case.name,
                    "command": " ".join(["navrl-daemon", *case.args])[:200],
                    "expected": case.expected,
                    "exit_code": done.returncode,
                    "traceback": "Traceback" in done.stderr + done.stdout,
                    "message": (done.stderr.strip().splitlines() or [""])[-1][:300],
                }
            )
    resume = navrl(["run", "--state-dir", str(state), *SMALL, "run.total_frames=320"], tmp)
    events = [json.loads(x) for x in resume.stderr.splitlines() if x.startswith("{")]
    resumed = [e for e in events if e.get("event") == "resumed from checkpoint"]
    return {
        "cases": cases,
        "as_expected": all(c["exit_code"] == c["expected"] and not c["traceback"] for c in cases),
        "marker_written": marker.exists(),
        "first_exit_code": first.returncode,
        "newest_valid_before": newest,
        "resumed_from": resumed[0]["iteration"] if resumed else None,
        "resume_exit_code": resume.returncode,
    }


SCENARIOS: dict[str, Callable[[Path], dict[str, Any]]] = {
    "full_disk": full_disk,
    "idle_connections": idle_connections,
    "deleted_lock": deleted_lock,
    "index_corruption": index_corruption,
    "connection_churn": connection_churn,
    "misnamed_checkpoint": misnamed_checkpoint,
    "oversize_claim": oversize_claim,
    "startup_signal": startup_signal,
    "security": security,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument(
        "--startup-signals", type=int, metavar="N", help="only `startup_signal`, with N signals"
    )
    ap.add_argument("--budget-s", type=float, help="with --startup-signals: stop sending after S s")
    ap.add_argument("--max-delay-s", type=float, default=3.0, help="with --startup-signals")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    scenarios = dict(SCENARIOS)
    scenarios["startup_signal"] = functools.partial(startup_signal, seed=args.seed)
    if args.startup_signals is not None:
        args.scenarios = "startup_signal"
        scenarios["startup_signal"] = functools.partial(
            startup_signal,
            count=args.startup_signals,
            seed=args.seed,
            budget_s=args.budget_s,
            max_delay_s=args.max_delay_s,
        )
    t_start = time.monotonic()
    load_start = os.getloadavg()
    results: dict[str, Any] = {}
    for name in args.scenarios.split(","):
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"faults-{name}-") as tmp:
            try:
                results[name] = scenarios[name](Path(tmp))
            except Exception as err:  # reported, and the next scenario still runs
                results[name] = {
                    "error": f"{type(err).__name__}: {err}",
                    "traceback": traceback.format_exc().splitlines()[-6:],
                }
        results[name]["seconds"] = round(time.monotonic() - t0, 1)
        print(f"{name}: done in {results[name]['seconds']} s", file=sys.stderr)
    print(
        json.dumps(
            {
                "benchmark": "faults",
                "scenarios": results,
                "seconds": round(time.monotonic() - t_start, 1),
                "machine": platform.machine(),
                "cores": os.cpu_count(),
                "loadavg_start": [round(x, 2) for x in load_start],
                "loadavg_end": [round(x, 2) for x in os.getloadavg()],
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
