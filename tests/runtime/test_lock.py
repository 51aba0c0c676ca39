"""The state-dir lock between real processes, including one killed with SIGKILL."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from navrl_daemon.errors import StateLocked
from navrl_daemon.runtime.lock import StateDirLock

REPO = Path(__file__).resolve().parents[2]

# Another navrl-daemon, as far as the lock can tell: acquire, report, then hold if asked to.
OTHER_DAEMON = """
import sys, time
from pathlib import Path
from navrl_daemon.errors import StateLocked
from navrl_daemon.runtime.lock import StateDirLock
try:
    StateDirLock(Path(sys.argv[1])).acquire()
except StateLocked as error:
    print(error, flush=True)
    sys.exit(error.exit_code)
print("acquired", flush=True)
if sys.argv[2:] == ["hold"]:
    time.sleep(60)
"""


def other_daemon(state_dir: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", OTHER_DAEMON, str(state_dir), *args],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )


def test_a_second_process_is_refused_with_75_naming_our_pid(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    lock = StateDirLock(state_dir)
    lock.acquire()

    refused = other_daemon(state_dir)
    out, _ = refused.communicate(timeout=30)
    assert refused.returncode == StateLocked.exit_code == 75
    assert f"state dir {state_dir} is locked by another navrl-daemon (pid {os.getpid()})" in out
    assert "--state-dir" in out

    lock.release()
    allowed = other_daemon(state_dir)
    out, _ = allowed.communicate(timeout=30)
    assert allowed.returncode == 0
    assert out.strip() == "acquired"


def test_a_holder_killed_with_sigkill_does_not_block(tmp_path: Path) -> None:
    holder = other_daemon(tmp_path, "hold")
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "acquired"
        with pytest.raises(StateLocked, match=f"pid {holder.pid}"):
            StateDirLock(tmp_path).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.communicate(timeout=30)
    assert holder.returncode == -signal.SIGKILL
    assert StateDirLock.holder_pid(tmp_path) == holder.pid  # the stale file is still there

    with StateDirLock(tmp_path):
        assert StateDirLock.holder_pid(tmp_path) == os.getpid()


def test_acquire_creates_the_dir_and_records_our_pid(tmp_path: Path) -> None:
    state_dir = tmp_path / "a" / "b"
    with StateDirLock(state_dir) as lock:
        assert lock.path == state_dir / "lock"
        assert lock.path.read_text() == f"{os.getpid()}\n"
        assert StateDirLock.holder_pid(state_dir) == os.getpid()

        # flock is per open file: a second lock in this same process is refused too.
        with pytest.raises(StateLocked, match=f"pid {os.getpid()}"):
            StateDirLock(state_dir).acquire()
        with pytest.raises(RuntimeError):
            lock.acquire()

    assert lock.path.exists()  # left in place, but no longer naming a holder
    assert StateDirLock.holder_pid(state_dir) is None


def test_release_is_idempotent_and_the_lock_can_be_taken_again(tmp_path: Path) -> None:
    lock = StateDirLock(tmp_path)
    lock.release()
    lock.acquire()
    lock.release()
    lock.release()
    with StateDirLock(tmp_path):
        pass
    lock.acquire()
    lock.release()


@pytest.mark.parametrize("content", ["", "not a pid\n", "-3\n"])
def test_an_unreadable_holder_pid_is_reported_as_unknown(tmp_path: Path, content: str) -> None:
    (tmp_path / "lock").write_text(content)
    fd = os.open(tmp_path / "lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held by someone who wrote no pid
        with pytest.raises(StateLocked, match=r"\(pid unknown\)") as refused:
            StateDirLock(tmp_path).acquire()
        assert refused.value.exit_code == 75
    finally:
        os.close(fd)
    assert StateDirLock.holder_pid(tmp_path) is None


def test_holder_pid_of_a_dir_without_a_lock_file_is_none(tmp_path: Path) -> None:
    assert StateDirLock.holder_pid(tmp_path / "missing") is None


def test_a_deleted_lock_file_is_recreated_and_a_second_process_still_refused(
    tmp_path: Path,
) -> None:
    lock = StateDirLock(tmp_path, check_s=None)
    with lock:
        assert not lock.keep()  # nothing to do while the path names the locked file
        lock.path.unlink()
        assert lock.keep()
        assert StateDirLock.holder_pid(tmp_path) == os.getpid()
        refused = other_daemon(tmp_path)
        out, _ = refused.communicate(timeout=30)
        assert refused.returncode == 75, out
        assert f"pid {os.getpid()}" in out


def test_a_deleted_state_dir_is_recreated_by_the_watcher(tmp_path: Path) -> None:
    import shutil
    import time

    state_dir = tmp_path / "state"
    with StateDirLock(state_dir, check_s=0.05):
        (state_dir / "history.jsonl").write_text("{}\n")
        shutil.rmtree(state_dir)
        deadline = time.monotonic() + 10
        while StateDirLock.holder_pid(state_dir) != os.getpid():
            assert time.monotonic() < deadline, "the watcher did not re-create the lock"
            time.sleep(0.02)
        refused = other_daemon(state_dir)
        assert refused.communicate(timeout=30)[0] and refused.returncode == 75


def test_a_lock_taken_over_by_another_process_is_reported(tmp_path: Path) -> None:
    lost: list[StateLocked] = []
    lock = StateDirLock(tmp_path, check_s=None, on_lost=lost.append)
    lock.acquire()
    lock.path.unlink()
    holder = other_daemon(tmp_path, "hold")
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "acquired"  # it locked a new file
        with pytest.raises(StateLocked, match=f"deleted and another process \\(pid {holder.pid}"):
            lock.keep()
    finally:
        holder.kill()
        holder.communicate(timeout=30)
        lock.release()


def test_a_state_dir_that_is_a_file_is_a_config_error(tmp_path: Path) -> None:
    from navrl_daemon.errors import ConfigError

    (tmp_path / "state").write_text("not a dir")
    with pytest.raises(ConfigError, match=f"state dir {tmp_path / 'state'}: not a directory"):
        StateDirLock(tmp_path / "state").acquire()
    with pytest.raises(ConfigError, match="cannot create it: Not a directory"):
        StateDirLock(tmp_path / "state" / "sub").acquire()


def test_a_lock_path_that_is_a_directory_is_a_config_error(tmp_path: Path) -> None:
    from navrl_daemon.errors import ConfigError

    (tmp_path / "lock").mkdir()
    with pytest.raises(ConfigError, match=f"lock file {tmp_path / 'lock'}: is a directory") as e:
        StateDirLock(tmp_path).acquire()
    assert e.value.exit_code == 78
