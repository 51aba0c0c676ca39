"""Single-instance lock on a state dir: `flock` on `STATE_DIR/lock`, which holds the owner's pid.

`flock` dies with its process, so a daemon killed with SIGKILL leaves a file behind but no
lock: the next start acquires it without anyone cleaning up.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from types import TracebackType

from navrl_daemon.errors import StateLocked


class StateDirLock:
    """Held for the daemon's whole life; a second daemon on the same state dir gets StateLocked."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / "lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already held by this StateDirLock")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            pid = self.holder_pid(self.state_dir)
            holder = "pid unknown" if pid is None else f"pid {pid}"
            raise StateLocked(
                f"state dir {self.state_dir} is locked by another navrl-daemon ({holder}); "
                "stop it first or use another --state-dir"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            os.fsync(fd)
        except BaseException:
            os.close(fd)  # closing drops the flock too
            raise
        self._fd = fd

    def release(self) -> None:
        """Unlock and close; the file stays (unlinking it would race with the next holder)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            # Cleared while still locked, so it cannot erase the next holder's pid.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> StateDirLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    @staticmethod
    def holder_pid(state_dir: Path) -> int | None:
        """The pid written in the lock file, without locking; None if absent or unreadable.

        It names the last holder, which may have died since: only acquire() knows for sure.
        """
        try:
            text = (Path(state_dir) / "lock").read_text(encoding="ascii").strip()
            pid = int(text)
        except (OSError, ValueError):
            return None
        return pid if pid > 0 else None
