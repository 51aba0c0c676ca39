"""Single-instance lock on a state dir: `flock` on `STATE_DIR/lock`, which holds the owner's pid.

`flock` dies with its process, so a daemon killed with SIGKILL leaves a file behind but no
lock: the next start acquires it without anyone cleaning up.

The flock is on the lock file's inode, but every other file is written by path. If
`STATE_DIR/lock`, or the whole dir, is deleted while a daemon runs, a second daemon could
lock a new file at the same path and both would write the same checkpoints. So the holder
checks that the path still names the file it locked: when acquiring, and then every
`check_s` seconds from a watcher thread. If it no longer does, the holder re-creates the
file (and the dir) and locks it again: training goes on, and its next checkpoint lands in
the re-created dir. If another process got that lock first, the dir is no longer this
daemon's: `on_lost` runs, by default an immediate exit 75 that writes nothing more (the
state a kill -9 leaves, which the other daemon resumes from).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import structlog

from navrl_daemon.errors import ConfigError, StateLocked

log = structlog.get_logger("lock")

# How often a held lock checks that its path still names the locked file.
CHECK_S = 1.0
# Attempts at locking a path that keeps being replaced between open() and flock().
_ATTEMPTS = 10


def exit_at_once(err: StateLocked) -> None:
    """The default `on_lost`: log and leave now, without flushing a single stage."""
    log.error("state dir taken over: stopping without writing", error=str(err))
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    os._exit(err.exit_code)


class StateDirLock:
    """Held for the daemon's whole life; a second daemon on the same state dir gets StateLocked.

    A state dir that cannot be used (a file, not writable, a directory where the lock file
    goes) is a ConfigError naming the path. `check_s=None` starts no watcher (`keep()` can
    then be called by hand)."""

    def __init__(
        self,
        state_dir: Path,
        *,
        check_s: float | None = CHECK_S,
        on_lost: Callable[[StateLocked], None] = exit_at_once,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / "lock"
        self.check_s = check_s
        self.on_lost = on_lost
        self._fd: int | None = None
        self._mutex = threading.Lock()  # the watcher and release() both replace _fd
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def acquire(self) -> None:
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already held by this StateDirLock")
        self._fd = self._lock()
        try:
            self._check_writable()
        except BaseException:
            self.release()
            raise
        if self.check_s is not None:
            self._stop.clear()
            self._watcher = threading.Thread(target=self._watch, name="state-dir-lock", daemon=True)
            self._watcher.start()

    def keep(self) -> bool:
        """Make sure the path still names the locked file; re-create and re-lock it if not.

        Returns whether it had to. Raises StateLocked if another process holds the path."""
        with self._mutex:
            if self._fd is None or _same_file(self.path, self._fd):
                return False
            fd = self._lock(taken_over=True)
            os.close(self._fd)  # the deleted file's lock, which nobody can reach any more
            self._fd = fd
        log.warning(
            "lock file was deleted or replaced: re-created and locked again",
            path=str(self.path),
        )
        return True

    def release(self) -> None:
        """Unlock and close; the file stays (unlinking it would race with the next holder)."""
        self._stop.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join()
        self._watcher = None
        with self._mutex:
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

    def _watch(self) -> None:
        assert self.check_s is not None
        while not self._stop.wait(self.check_s):
            try:
                self.keep()
            except StateLocked as err:
                self.on_lost(err)
                return
            except ConfigError as err:  # cannot re-create it now (e.g. the dir is a file)
                log.warning("lock file missing and cannot be re-created", error=str(err))

    def _lock(self, *, taken_over: bool = False) -> int:
        """Open (creating dir and file), flock and check that the path still names the
        locked file; return the fd with our pid written in it."""
        for _ in range(_ATTEMPTS):
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise self._locked(taken_over) from None
            except BaseException:
                os.close(fd)
                raise
            if not _same_file(self.path, fd):  # deleted or replaced between open and flock
                os.close(fd)
                continue
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
                os.fsync(fd)
            except BaseException:
                os.close(fd)  # closing drops the flock too
                raise
            return fd
        raise StateLocked(f"lock file {self.path} keeps being replaced; cannot lock it")

    def _open(self) -> int:
        where = f"state dir {self.state_dir}"
        if self.state_dir.exists() and not self.state_dir.is_dir():
            raise ConfigError(f"{where}: not a directory (--state-dir / run.state_dir)")
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            why = _broken_link(self.state_dir) or err.strerror or str(err)
            raise ConfigError(f"{where}: cannot create it: {why}") from None
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except IsADirectoryError:
            raise ConfigError(
                f"lock file {self.path}: is a directory; remove it (the daemon keeps a "
                "plain file there)"
            ) from None
        except OSError as err:
            raise ConfigError(
                f"{where}: cannot create the lock file {self.path}: {err.strerror or err}"
            ) from None

    def _locked(self, taken_over: bool) -> StateLocked:
        pid = self.holder_pid(self.state_dir)
        holder = "pid unknown" if pid is None else f"pid {pid}"
        if taken_over:
            return StateLocked(
                f"lock file {self.path} was deleted and another process ({holder}) has "
                "locked the state dir since"
            )
        return StateLocked(
            f"state dir {self.state_dir} is locked by another navrl-daemon ({holder}); "
            "stop it first or use another --state-dir"
        )

    def _check_writable(self) -> None:
        try:
            fd, probe = tempfile.mkstemp(prefix=".tmp-probe-", dir=self.state_dir)
        except OSError as err:
            raise ConfigError(
                f"state dir {self.state_dir}: not writable: {err.strerror or err}"
            ) from None
        os.close(fd)
        os.unlink(probe)


def _broken_link(path: Path) -> str | None:
    """Why a path through symbolic links leads nowhere (mkdir only says "File exists"):
    links that loop, or the link in it whose target does not exist; else None."""
    try:
        os.stat(path)
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "its symbolic links loop (ELOOP); point them at a directory"
    for part in [path, *path.parents]:
        if part.is_symlink() and not part.exists():
            return (
                f"{part} is a symbolic link to {os.readlink(part)}, which does not exist; "
                "create that directory or point the link elsewhere"
            )
    return None


def _same_file(path: Path, fd: int) -> bool:
    """Whether `path` names the file open as `fd` (not deleted, not replaced)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    held = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)
