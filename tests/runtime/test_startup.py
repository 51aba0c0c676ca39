"""runtime/startup.py: a start-up that never finishes its first iteration is ended with its
phase and every thread's stack in the log, and exit code 70; one that does is left alone."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from structlog.testing import capture_logs

from navrl_daemon.runtime.startup import EXIT_STARTUP_TIMEOUT, StartupWatchdog, thread_stacks
from tests.conftest import TINY, navrl_cli


def test_a_start_up_past_its_limit_logs_the_phase_and_stacks_then_exits_70() -> None:
    codes: list[int] = []
    fired = threading.Event()

    def on_timeout(code: int) -> None:
        codes.append(code)
        fired.set()

    with capture_logs() as logs:
        watchdog = StartupWatchdog(0.3, on_timeout=on_timeout).start()
        with watchdog.phase("training envs"):
            assert fired.wait(10)
    assert codes == [EXIT_STARTUP_TIMEOUT]
    [timeout] = [e for e in logs if e["event"].startswith("start-up timed out")]
    assert timeout["phase"] == "training envs" and timeout["timeout_s"] == 0.3
    # this test's own frame is in the main thread's stack
    main = [stack for name, stack in timeout["stacks"].items() if name.startswith("MainThread")]
    assert len(main) == 1 and "test_a_start_up_past_its_limit" in main[0]


def test_a_start_up_that_finishes_in_time_is_left_alone() -> None:
    codes: list[int] = []
    with capture_logs() as logs:
        watchdog = StartupWatchdog(0.5, on_timeout=codes.append).start()
        with watchdog.phase("policy and update"):
            pass
        watchdog.enter("first iteration")
        watchdog.started()
        time.sleep(0.8)  # past the limit: nothing may fire now
    assert codes == []
    phases = [e["phase"] for e in logs if e["event"] == "start-up phase"]
    assert phases == ["policy and update", "first iteration"]
    assert [e["event"] for e in logs][-1] == "started"


def test_no_limit_watches_nothing() -> None:
    watchdog = StartupWatchdog(0.0, on_timeout=lambda code: None).start()
    assert watchdog._thread is None


def test_thread_stacks_names_every_thread() -> None:
    release = threading.Event()
    worker = threading.Thread(target=release.wait, name="stuck-worker")
    worker.start()
    try:
        names = list(thread_stacks())
        assert any(n.startswith("stuck-worker") for n in names)
        assert any(n.startswith("MainThread") for n in names)
    finally:
        release.set()
        worker.join()


def test_a_daemon_stuck_building_its_envs_exits_70_with_the_phase_and_stacks(
    tmp_path: Path,
) -> None:
    t0 = time.monotonic()
    proc = navrl_cli(
        "run",
        "--state-dir",
        str(tmp_path / "state"),
        *TINY,
        "log.format=json",
        "env.backend=tests.runtime.stalling_backend:never_returns",
        "run.startup_timeout_s=4",
        timeout=120,
        process=True,  # the watchdog ends the process
    )
    assert proc.returncode == EXIT_STARTUP_TIMEOUT, proc.stderr[-3000:]
    assert time.monotonic() - t0 < 90  # 4 s of start-up once torch is imported
    events = [json.loads(x) for x in proc.stderr.splitlines() if x.startswith("{")]
    [timeout] = [e for e in events if e["event"].startswith("start-up timed out")]
    assert timeout["phase"] == "training envs"
    assert any("never_returns" in stack for stack in timeout["stacks"].values())
    # the phases that ended before it are logged with their durations
    ended = [e["phase"] for e in events if e["event"] == "start-up phase"]
    assert ended[:2] == ["newest checkpoint", "policy and update"]
    assert "Traceback" not in proc.stderr
