"""Real SIGINT/SIGTERM/SIGHUP to a real `navrl-daemon run` at every moment of its life:
as soon as it can catch them (before torch is imported), while the event loop builds the
stages, while training (SIGHUP), and after the stop finished. Each one exits 0 without a
traceback; a stop while training writes the final checkpoint and the export.

Once the event loop runs, all three take one path (runtime/signals.py queues them for the
supervisor), so the later moments are tested with one signal each: SIGINT, whose
KeyboardInterrupt used to escape there, and SIGHUP while training. SIGTERM and SIGINT
while training: tests/test_daemon_signals.py."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from navrl_daemon.testing.daemon_process import Daemon
from tests.conftest import REPO, SUBPROCESS_ENV, TINY

STOPS = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP]


def caught_signals(pid: int) -> set[int]:
    """The signals process `pid` has a handler for (SigCgt in /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            mask = int(line.split()[1], 16)
            return {n for n in range(1, 65) if mask & (1 << (n - 1))}
    return set()


@pytest.mark.parametrize("sig", STOPS, ids=lambda s: s.name)
def test_a_stop_as_soon_as_the_process_can_catch_it_exits_0(
    tmp_path: Path, sig: signal.Signals
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "navrl_daemon", "run", "--state-dir", str(tmp_path), *TINY],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
        env=SUBPROCESS_ENV,
    )
    try:
        # SIGHUP is caught by nothing but our handlers, installed on main's first line.
        deadline = time.monotonic() + 60
        while signal.SIGHUP not in caught_signals(proc.pid):
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "SIGHUP never caught"
            time.sleep(0.005)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    assert f"navrl-daemon: stopped by {sig.name}" in err or '"stopped by a signal"' in err
    assert not list(tmp_path.glob("checkpoints/ckpt-*.nrc"))


def test_a_stop_while_the_stages_are_built_exits_0(tmp_path: Path) -> None:
    sig = signal.SIGINT
    d = Daemon(tmp_path)
    d.wait_for("starting")  # the event loop runs; the stages are not built yet
    d.proc.send_signal(sig)
    code, _ = d.finish(timeout=120)
    assert code == 0, d.events[-5:]
    stopped = [e for e in d.events if e["event"] == "stopped"]
    assert len(stopped) == 1 and stopped[0]["reason"] == sig.name
    assert d.names().index("stopped") >= len(d.names()) - 2  # at most the run summary after it
    assert "collecting" not in d.names()  # no rollout was started after the stop


def test_sighup_while_training_stops_like_sigterm(tmp_path: Path) -> None:
    d = Daemon(tmp_path, "ppo.rollout_length=200", "ppo.epochs=1", "ppo.minibatches=1")
    d.wait_for("collecting", count=2)
    d.proc.send_signal(signal.SIGHUP)
    code, _ = d.finish(timeout=120)
    assert code == 0, d.events[-5:]
    exported = next(e for e in d.events if e["event"] == "policy exported")
    final = [e for e in d.events if e["event"] == "checkpoint written" and e["final"]]
    assert final and final[-1]["iteration"] == exported["iteration"]
    assert (tmp_path / "export" / "policy.pt").exists()
    assert [e["reason"] for e in d.events if e["event"] == "stopped"] == ["SIGHUP"]


def test_a_late_ctrl_c_after_the_stop_finished_changes_nothing(tmp_path: Path) -> None:
    d = Daemon(tmp_path, "run.total_frames=128")
    assert d.proc.stderr is not None
    d.wait_for("state", count=3)  # running, draining, stopped: the supervisor is done
    assert d.events[-1]["state"] == "stopped"
    for _ in range(3):  # a late Ctrl-C, pressed again and again
        if d.proc.poll() is not None:
            break
        d.proc.send_signal(signal.SIGINT)
        time.sleep(0.05)
    rest = d.proc.stderr.read()
    code = d.proc.wait(timeout=60)
    assert code == 0, rest[-2000:]
    assert "Traceback" not in rest, rest[-2000:]
    assert (tmp_path / "export" / "policy.pt").exists()
