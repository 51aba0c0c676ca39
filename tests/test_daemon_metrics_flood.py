"""A thousand idle connections to a real daemon's metrics port, under a low open-file limit:
training and checkpoints go on, a scrape still works, and the daemon's threads and file
descriptors stay bounded (before the fix: one thread per connection, then EMFILE for the
checkpoint writer and exit 1)."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from navrl_daemon.testing.daemon_process import Daemon

FD_LIMIT = 256  # the daemon's RLIMIT_NOFILE: far fewer than the connections below
CONNECTIONS = 1000
# File descriptors the endpoint may add under the flood (it holds at most 16 connections).
FD_ROOM = 20
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def threads_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("Threads:")).split()[1])


def fds_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@contextlib.contextmanager
def fd_room(count: int) -> Iterator[None]:
    """This process may hold `count` more sockets (soft limit raised up to the hard one)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, count + 256) if hard != resource.RLIM_INFINITY else count + 256
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_idle_connections_take_nothing_from_training(tmp_path: Path) -> None:
    d = Daemon(
        tmp_path,
        "log.level=info",  # the test reads the log only between steps: keep it short
        "checkpoint.interval=1",
        "checkpoint.keep_last=2",
        "run.total_frames=100000000",
        rlimits={resource.RLIMIT_NOFILE: (FD_LIMIT, FD_LIMIT)},
    )
    held: list[socket.socket] = []
    try:
        d.wait_for("metrics endpoint")
        url = d.events[-1]["url"]
        port = int(url.rsplit(":", 1)[1])
        d.wait_for("checkpoint written")
        threads, fds = threads_of(d.proc.pid), fds_of(d.proc.pid)

        with fd_room(CONNECTIONS):
            for _ in range(CONNECTIONS):
                held.append(socket.create_connection(("127.0.0.1", port), timeout=30))
            flood_from = len(d.events)
            # Training and checkpoints go on while the connections are held...
            d.wait_for("checkpoint written", count=2)
            assert threads_of(d.proc.pid) <= threads + 2
            assert fds_of(d.proc.pid) <= fds + FD_ROOM
            # ...and a scrape gets through.
            with OPENER.open(url + "/metrics", timeout=30) as reply:
                assert reply.status == 200
                assert b"navrl_iterations_total" in reply.read()
            d.wait_for("checkpoint written")
            assert threads_of(d.proc.pid) <= threads + 2
            assert fds_of(d.proc.pid) <= fds + FD_ROOM
            failed = [e for e in d.events[flood_from:] if e["level"] in ("error", "critical")]
            assert not failed, failed
        d.proc.send_signal(signal.SIGTERM)
        code, _ = d.finish(timeout=120)
    finally:
        for sock in held:
            sock.close()
        if d.proc.poll() is None:
            d.proc.kill()
    assert code == 0, d.events[-5:]
    # Nothing lost: the last checkpoint holds the exported, last trained iteration.
    exported = next(e for e in d.events if e["event"] == "policy exported")
    written = [e for e in d.events if e["event"] == "checkpoint written"]
    assert written[-1]["iteration"] == exported["iteration"]
