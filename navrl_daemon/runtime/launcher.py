"""torchrun as a child process whose ranks are stopped the way a plain `run` is stopped.

torchrun handles SIGTERM, SIGINT and SIGHUP itself: it forwards the signal to the ranks,
gives them `--shutdown-timeout` (30 s by default) before SIGKILL, and then exits 1 whatever
the ranks did. Under systemd that makes every clean stop a "failed" unit, and a drain
longer than 30 s (a NavRL-scale update plus the final checkpoint) loses the checkpoint.

`Launcher` starts torchrun in a session of its own, so that neither a terminal's Ctrl-C
nor anything else aimed at this process reaches it, and turns each stop signal this
process gets into a SIGTERM to every rank (torchrun's children), rank by rank: the ranks
agree on the rollout to stop after, write one final checkpoint, exit 0, and torchrun,
seeing every worker succeed, exits 0 as well. Any other ending passes torchrun's exit
code through (a failed or killed rank: non-zero).
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

import structlog

from navrl_daemon.runtime.signals import StopSignals

log = structlog.get_logger("launch")

# How often the launcher looks for new stop signals and new ranks, in seconds.
POLL_S = 0.1


class Launcher:
    def __init__(self, command: Sequence[str], signals: StopSignals) -> None:
        self.command = list(command)
        self.signals = signals
        self._stops_sent: dict[int, int] = {}  # rank pid -> SIGTERMs sent to it

    def run(self) -> int:
        """Run torchrun to its end; returns its exit code."""
        with self.signals.queued():
            log.info("launching", command=" ".join(self.command))
            torchrun = subprocess.Popen(self.command, start_new_session=True)
            while True:
                try:
                    code = torchrun.wait(timeout=POLL_S)
                except subprocess.TimeoutExpired:
                    self._forward_stops(torchrun.pid)
                    continue
                log.info("torchrun exited", code=code, stops=len(self.signals.received))
                return code

    def _forward_stops(self, torchrun_pid: int) -> None:
        """Every rank gets one SIGTERM per stop signal received so far; a rank that started
        after a stop (still starting up) gets it as soon as it is seen."""
        wanted = len(self.signals.received)
        if not wanted:
            return
        for pid in child_pids(torchrun_pid):
            while self._stops_sent.get(pid, 0) < wanted:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    break
                self._stops_sent[pid] = self._stops_sent.get(pid, 0) + 1
                log.info("stop sent to rank", pid=pid, stop=self._stops_sent[pid])


def child_pids(parent: int) -> list[int]:
    """The pids whose parent is `parent` (from /proc/PID/stat), i.e. torchrun's ranks."""
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # pid (comm) state ppid ...; comm may hold spaces and parentheses.
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == parent:
            children.append(int(entry.name))
    return children
