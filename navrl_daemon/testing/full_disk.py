"""A disk filled as another process would fill it: a filler file takes every free byte (a
small tmpfs keeps the rest of the disk out of it: tests/small_disk.py mounts one)."""

from __future__ import annotations

import errno
import os
from pathlib import Path


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(disk: Path, leave: int = 0, name: str = "filler") -> Path:
    """Write a filler file until only about `leave` bytes are free (0: completely full)."""
    path = disk / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while (room := free_bytes(disk) - leave) > 0:
            try:
                os.write(fd, b"\0" * min(room, 1 << 20))
            except OSError as err:
                if err.errno != errno.ENOSPC:
                    raise
                break
    finally:
        os.close(fd)
    return path
