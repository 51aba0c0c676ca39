"""`navrl-daemon status` against a real daemon subprocess: running and healthy (0), running
but not answering (1, a SIGSTOPped daemon), not running (3)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from navrl_daemon.cli import main
from navrl_daemon.testing.daemon_process import Daemon


def status(capsys: pytest.CaptureFixture[str], state: Path, *flags: str) -> tuple[int, str]:
    """The command in this process (the daemon is the real subprocess); no exception may
    escape it."""
    code = main(["status", "--state-dir", str(state), *flags])
    return code, capsys.readouterr().out


def status_json(capsys: pytest.CaptureFixture[str], state: Path) -> tuple[int, dict]:
    code, out = status(capsys, state, "--json")
    return code, json.loads(out)


def wait_for_progress(daemon: Daemon, count: int) -> None:
    """Daemon.wait_for, skipping lines that are not JSON: the daemon's HTTP thread prints a
    traceback when it answers the request the status client gave up on (socketserver's
    default handle_error on the broken connection), interleaved with the log lines."""
    assert daemon.proc.stderr is not None
    seen = 0
    for line in daemon.proc.stderr:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        daemon.events.append(event)
        seen += event["event"] == "progress"
        if seen == count:
            return
    raise AssertionError(f"daemon ended before {count} progress lines: {daemon.events[-5:]}")


def test_status_of_a_running_then_stopped_daemon(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    code, doc = status_json(capsys, state)
    assert code == 3 and doc["running"] is False and doc["reason"] == "no such state dir"

    daemon = Daemon(state, "run.total_frames=100000000", "log.level=info", "checkpoint.interval=2")
    try:
        daemon.wait_for("progress", 3)
        code, doc = status_json(capsys, state)
        assert code == 0, doc
        assert doc["running"] is True and doc["healthy"] is True
        assert doc["pid"] == daemon.proc.pid
        assert doc["source"] == "endpoint" and doc["state"] == "running"
        assert doc["iteration"] >= 3 and doc["frames_per_second"] > 0
        assert set(doc["queues"]) >= {"rollouts", "weights", "snapshots"}
        assert doc["last_checkpoint"]["iteration"] >= 2 and doc["last_checkpoint"]["age_s"] >= 0
        code, text = status(capsys, state)
        assert code == 0
        assert f"running: pid {daemon.proc.pid}, running, healthy" in text

        # A hung daemon: it still holds the lock, its endpoint no longer answers.
        os.kill(daemon.proc.pid, signal.SIGSTOP)
        try:
            code, doc = status_json(capsys, state)
        finally:
            os.kill(daemon.proc.pid, signal.SIGCONT)
        assert code == 1, doc
        assert doc["running"] is True and doc["healthy"] is False
        assert doc["pid"] == daemon.proc.pid
        assert "did not answer" in doc["reason"]
        assert doc["source"] == "files" and doc["iteration"] >= 3  # from history.jsonl

        # The probes did not disturb it: it trains on and stops cleanly.
        wait_for_progress(daemon, 3)
        daemon.proc.send_signal(signal.SIGTERM)
        assert daemon.finish()[0] == 0
    finally:
        if daemon.proc.poll() is None:
            daemon.proc.kill()
            daemon.proc.wait()

    code, doc = status_json(capsys, state)
    assert code == 3 and doc["running"] is False and doc["pid"] is None
    assert doc["reason"] == "no daemon holds the state dir"
    last = max(e["iteration"] for e in daemon.events if e["event"] == "progress")
    assert doc["iteration"] == last and doc["source"] == "files"
    assert not (state / "daemon.json").exists()
    code, text = status(capsys, state)
    assert code == 3 and text.startswith(f"not running: no daemon holds the state dir ({state})")
