"""The log's stream, which outlives its reader: a run goes on when stderr stops taking
lines (a killed `tee`, a dropped ssh session, `| head`, a closed descriptor).

Until then every line goes to stderr. The first write that fails (EPIPE: the reader went
away; EBADF: no descriptor; EIO: the terminal hung up) gives stderr up: its descriptor
is pointed at /dev/null, so nothing else writing there fails either (tracebacks, C
libraries, the interpreter's last flush), and the lines go on into `STATE_DIR/daemon.log`
once `run` has named it and the state dir exists, the first of them saying what was
lost and why; before that, or for a command without a state dir, they are dropped.
"""

from __future__ import annotations

import datetime
import errno
import json
import os
import threading
from pathlib import Path
from typing import IO, Any

LOG_FILE = "daemon.log"
# What a write to a stream that has lost its reader or descriptor raises; ValueError: a
# write to a closed file object.
LOST = (OSError, ValueError)


class LogStream:
    """A file-like object for structlog: `lines` (stderr, ops/console.py) while it takes
    them, then the file `continue_in` named (see the module docstring). Never raises."""

    def __init__(self, lines: Any) -> None:
        self.lines = lines
        self.lost: str | None = None  # why stderr was given up
        self.dropped = 0  # lines written nowhere
        self._path: Path | None = None
        self._file: IO[str] | None = None
        self._lock = threading.Lock()  # the lost path only; stderr's writes have tqdm's

    def continue_in(self, path: Path) -> None:
        """Where lines go once stderr is lost: `path`, made only then and only in a
        directory that exists (the state dir, made by its lock)."""
        self._path = path

    def write(self, text: str) -> int:
        if self.lost is None:
            try:
                return int(self.lines.write(text))
            except LOST as err:
                self._lose(err)
        with self._lock:
            self._keep(text)
        return len(text)

    def flush(self) -> None:
        if self.lost is None:
            try:
                self.lines.flush()
            except LOST as err:
                self._lose(err)

    def isatty(self) -> bool:
        return self.lost is None and bool(self.lines.isatty())

    def _lose(self, err: BaseException) -> None:
        with self._lock:
            if self.lost is None:
                self.lost = f"{type(err).__name__}: {err}"
                silence(self.lines)

    def _keep(self, text: str) -> None:
        if self._file is None and self._path is not None and self._path.parent.is_dir():
            try:
                self._file = open(self._path, "a", encoding="utf-8")  # noqa: SIM115
                self._file.write(json.dumps(self._note()) + "\n")
            except OSError:
                self._file = None
        try:
            if self._file is None:
                raise OSError(errno.ENOENT, "no log file yet")
            self._file.write(text)
            self._file.flush()
        except LOST:
            self.dropped += 1

    def _note(self) -> dict[str, Any]:
        return {
            "event": "log stream lost: stderr takes no more lines; the log goes on here",
            "error": self.lost,
            "lines_dropped": self.dropped,
            "pid": os.getpid(),
            "level": "warning",
            "timestamp": datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z"),
        }


def silence(stream: Any) -> None:
    """Point `stream`'s descriptor at /dev/null: what is still buffered for it and every
    later write then succeed, going nowhere. A stream without a descriptor of its own (a
    test's StringIO) is left as it is."""
    try:
        fd = stream.fileno()
    except LOST:  # none of its own, or closed already
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


def ensure_std_fds() -> None:
    """Descriptors 0, 1 and 2 open (on /dev/null where they were closed), so that no file
    the daemon opens later (a lock, a checkpoint) gets one of them and with it whatever
    is written to stdout or stderr."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            opened = os.open(os.devnull, os.O_RDWR)
            if opened != fd:
                os.dup2(opened, fd)
                os.close(opened)
