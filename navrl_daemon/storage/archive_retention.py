"""Rolling retention of a rollout archive directory: the newest rollouts within a byte cap.

Before each append the archiver asks `ArchiveRetention.make_room` whether the next
rollout fits: under `max_total_bytes` for the directory's archive files, and leaving
`reserve_bytes` free on the disk. When it does not fit and `rotate` is on, the oldest
finished files no reader holds are deleted until it does; with `rotate` off nothing is
ever deleted and the answer says why the rollout does not fit.

- Finished: every file but the one being written. A file a kill -9 left incomplete is
  finished too: nothing appends to an old file again.
- Held: a reader (`storage.archive.ArchiveFile`, in this process or another, such as the
  prefetcher's decode processes, or HDF5 itself with its file locking) holds a shared
  `flock` on the file. A held file is skipped, never deleted: its reader keeps its data,
  and deleting it would free nothing (an open file keeps its blocks until closed).

Deletion takes an exclusive lock first (non-blocking: a held file is skipped at once). A
reader that opens the file in that instant reads it unlocked; its open file stays
readable after the unlink. No asyncio here; the archiver calls it from its file thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from navrl_daemon.storage.archive import archive_files


@dataclass(frozen=True)
class ArchiveUsage:
    files: int
    bytes: int


@dataclass(frozen=True)
class Rotated:
    """The files one `make_room` deleted, oldest first, and their bytes."""

    files: tuple[str, ...]
    bytes: int


class ArchiveRetention:
    def __init__(
        self,
        directory: Path,
        *,
        max_total_bytes: int,
        reserve_bytes: int,
        rotate: bool,
        free_bytes: Callable[[Path], int] | None = None,
    ) -> None:
        self.directory = directory
        self.max_total_bytes = max_total_bytes
        self.reserve_bytes = reserve_bytes
        self.rotate = rotate
        self._free_bytes = free_bytes or _free_bytes
        self.rotated_files = 0  # deleted to make room, since this object was made
        self.rotated_bytes = 0

    def usage(self) -> ArchiveUsage:
        sizes = _sizes(archive_files(self.directory))
        return ArchiveUsage(len(sizes), sum(sizes.values()))

    def make_room(
        self, need: int, disk_need: int, writing: Path | None
    ) -> tuple[str | None, Rotated]:
        """Can `need` more bytes go into the directory, with `disk_need` free on the disk?
        Returns (None, what was deleted) when they can, or (why not, what was deleted)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        deleted: list[str] = []
        freed = 0
        while (why := self._short(need, disk_need)) is not None:
            if not self.rotate:
                break
            victim = self._delete_oldest(writing)
            if victim is None:
                why += "; no finished archive file that no reader holds is left to delete"
                break
            path, size = victim
            deleted.append(path.name)
            freed += size
        self.rotated_files += len(deleted)
        self.rotated_bytes += freed
        return why, Rotated(tuple(deleted), freed)

    def _short(self, need: int, disk_need: int) -> str | None:
        total = self.usage().bytes
        if total + need > self.max_total_bytes:
            return (
                f"archive.max_total_bytes: {total} bytes in the archive + {need} for the "
                f"next rollout > {self.max_total_bytes}"
            )
        free = self._free_bytes(self.directory)
        if free < disk_need + self.reserve_bytes:
            return (
                f"{free} bytes free on the archive's disk, {disk_need} needed while "
                f"keeping {self.reserve_bytes} spare"
            )
        return None

    def _delete_oldest(self, writing: Path | None) -> tuple[Path, int] | None:
        """Delete the oldest finished file no reader holds; its path and size, or None."""
        for path in archive_files(self.directory):
            if path == writing:
                continue
            size = _delete_unless_held(path)
            if size is not None:
                return path, size
        return None


def _delete_unless_held(path: Path) -> int | None:
    """Unlink `path` under an exclusive flock; None if a reader holds it (or it is gone)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        size = os.fstat(fd).st_size
        path.unlink()
        return size
    finally:
        os.close(fd)


def _sizes(paths: list[Path]) -> dict[Path, int]:
    out = {}
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            out[path] = path.stat().st_size
    return out


def _free_bytes(directory: Path) -> int:
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize
