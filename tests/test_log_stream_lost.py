"""A daemon whose stdout and stderr lose their reader (a killed `tee`, a dropped ssh
session, `| head`) or have no descriptor at all trains on, its log going on in
`STATE_DIR/daemon.log`, and a SIGTERM still stops it cleanly: exit 0, a final
checkpoint at its last iteration, `export/policy.pt`. It exited 1 within seconds, with
no final checkpoint and no export; during start-up it left a state dir with only `lock`.

Real daemon processes on a real pipe (both streams on it, as `2>&1 | tee`); the reader is
closed by this test."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from navrl_daemon.storage.checkpoint import read_header
from navrl_daemon.testing import forked
from navrl_daemon.testing.daemon_process import last_trained_is_kept
from tests.conftest import TINY

ARGS = [*TINY, "eval.interval=0", "run.total_frames=100000000", "checkpoint.interval=1000"]
LOST = "log stream lost: stderr takes no more lines; the log goes on here"


def start(state: Path, **streams: object) -> forked.Process:
    return forked.start(["run", "--state-dir", str(state), *ARGS], **streams)


def events_in(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.startswith("{")]


def wait_for_progress(log: Path, proc: forked.Process, past: int, timeout: float = 300) -> None:
    """Until `log` holds a "progress" line after iteration `past`: training went on."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = [e["iteration"] for e in events_in(log) if e["event"] == "progress"]
        if done and done[-1] > past:
            return
        assert proc.poll() is None, f"daemon exited {proc.returncode}: {events_in(log)[-5:]}"
        time.sleep(0.2)
    raise AssertionError(f"no progress past iteration {past} in {log} after {timeout} s")


def stop_and_check(state: Path, proc: forked.Process, before: list[dict]) -> list[dict]:
    """SIGTERM; then exit 0, the last trained iteration checkpointed, the policy exported,
    and the log file opened by the note saying what was lost."""
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0
    logged = events_in(state / "daemon.log")
    assert logged[0]["event"] == LOST, logged[:2]
    events = before + logged
    assert last_trained_is_kept(events), [e for e in events if "checkpoint" in e["event"]]
    trained = [e["iteration"] for e in events if e["event"] == "progress"]
    newest = max((state / "checkpoints").glob("ckpt-*.nrc"))
    assert read_header(newest).iteration == trained[-1]
    assert (state / "export" / "policy.pt").is_file()
    assert any(e["event"] == "stopped" and e["reason"] == "SIGTERM" for e in logged)
    assert not (state / "daemon.json").exists()  # removed by the clean stop
    return logged


def test_a_reader_that_goes_away_mid_run_loses_no_work(tmp_path: Path) -> None:
    state = tmp_path / "state"
    read, write = os.pipe()
    proc = start(state, stdout=write, stderr=write)
    os.close(write)
    before: list[dict] = []
    with open(read, encoding="utf-8") as pipe:
        for line in pipe:
            if line.startswith("{"):
                before.append(json.loads(line))
            if before and before[-1]["event"] == "progress":
                break
    # The reader is gone: the next line the daemon writes meets EPIPE.
    wait_for_progress(state / "daemon.log", proc, past=before[-1]["iteration"] + 2)
    logged = stop_and_check(state, proc, before)
    assert "BrokenPipeError" in logged[0]["error"]


def test_a_reader_gone_before_start_up_loses_no_work(tmp_path: Path) -> None:
    state = tmp_path / "state"
    read, write = os.pipe()
    os.close(read)
    proc = start(state, stdout=write, stderr=write)
    os.close(write)
    wait_for_progress(state / "daemon.log", proc, past=2)
    stop_and_check(state, proc, [])


def test_no_stdout_or_stderr_descriptor_at_all_loses_no_work(tmp_path: Path) -> None:
    """Descriptors 1 and 2 closed when Python starts (`2>&-`): no file the daemon opens
    takes their place, so no log line lands in the lock file or a checkpoint."""
    state = tmp_path / "state"

    def close_both() -> None:
        os.close(1)
        os.close(2)

    proc = forked.start(
        ["run", "--state-dir", str(state), *ARGS],
        preexec_fn=close_both,
        stdout=None,
        stderr=None,
    )
    assert isinstance(proc, subprocess.Popen)  # a fresh interpreter, as `2>&-` starts one
    wait_for_progress(state / "daemon.log", proc, past=2)
    assert (state / "lock").read_text() == f"{proc.pid}\n"  # the lock file holds its pid only
    logged = stop_and_check(state, proc, [])
    assert "no stderr" in logged[0]["error"]
