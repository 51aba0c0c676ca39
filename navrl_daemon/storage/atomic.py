"""Durable file replacement: temp file in the same dir → fsync → rename → fsync dir.

The file gets the mode a plain `open(path, "w")` would give it (0666 less the umask), not
the 0600 of the temp file it starts as: a report or an exported policy is meant to be read
by others where the umask allows it (a systemd unit's `UMask=` still decides).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so that a crash leaves either the old or the new file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def current_umask() -> int:
    """The process umask, read without setting it (os.umask would change it for a moment
    under every other thread)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # no /proc (not Linux): the racy way
    os.umask(mask)
    return mask


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def append_line(path: Path, line: str, *, fsync: bool = True) -> None:
    """Append one line, all or nothing (JSON-lines logs a reader may tail).

    A tail without its newline (a crash or a full disk mid-append) is cut before the line
    goes on, so the new line is never glued to a torn one; a write that fails (ENOSPC,
    EIO) truncates the file back to where it was and raises. `fsync=False` only flushes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (line.rstrip("\n") + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = _cut_torn_tail(fd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if fsync:
                os.fsync(fd)
        except BaseException:
            os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)


def _cut_torn_tail(fd: int) -> int:
    """Truncate an open file after its last newline; returns the size it then has."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return size
    end = size
    while end > 0:  # back to the last newline, a block at a time
        start = max(0, end - 65536)
        newline = os.pread(fd, end - start, start).rfind(b"\n")
        if newline >= 0:
            end = start + newline + 1
            break
        end = start
    os.ftruncate(fd, end)
    return end
