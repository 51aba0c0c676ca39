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

A scenario that fails is reported with its error; the others still run. Ratios are
during/before and after/before of the median frames/s of each phase (spread: min, max).

Run: `.venv/bin/python benchmarks/faults.py [--scenarios full_disk,idle_connections,...]`
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.small_disk import fill  # noqa: E402

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
    evaluated = [e["iteration"] for e in d.named("evaluation")]
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


def scrape(port: int, timeout: float = 10.0) -> dict[str, Any]:
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
            r.read()
            return {"ok": r.status == 200, "seconds": round(time.monotonic() - t0, 3)}
    except Exception as err:  # the point is to see how it fails
        return {"ok": False, "error": f"{type(err).__name__}: {err}"}


def idle_connections(tmp: Path, count: int = 1000) -> dict[str, Any]:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4 * count + 256), hard))
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


SCENARIOS: dict[str, Callable[[Path], dict[str, Any]]] = {
    "full_disk": full_disk,
    "idle_connections": idle_connections,
    "deleted_lock": deleted_lock,
    "index_corruption": index_corruption,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    args = ap.parse_args()
    t_start = time.monotonic()
    load_start = os.getloadavg()
    results: dict[str, Any] = {}
    for name in args.scenarios.split(","):
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"faults-{name}-") as tmp:
            try:
                results[name] = SCENARIOS[name](Path(tmp))
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
