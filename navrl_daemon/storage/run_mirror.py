"""A run's resume point kept in a second place (`checkpoint.mirror`): a folder on another
disk or a network file system, or an fsspec URL.

A resume point is what a run needs to go on elsewhere: its newest checkpoint, history.jsonl,
eval/results.jsonl, the exported policies (export/) and the resolved config, stored under
the paths they have in a state dir. The mirror holds one, in a folder of its own:

```
MIRROR/
  MIRROR.json                     which point is current, and each file's size and SHA-256
  point-000000120-<time>/         the current point: checkpoints/ckpt-000000120.nrc, ...
```

A new point is written into a new folder, every file synced, and only then is MIRROR.json
replaced (write to a temp name, rename): a write torn anywhere (a crash, a full disk, a
killed process) leaves the old point current. The folders of older points, and of torn
writes, are removed after the switch. Reading checks every file against MIRROR.json.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from navrl_daemon.errors import ConfigError, DataError
from navrl_daemon.storage.atomic import fsync_dir, write_atomic
from navrl_daemon.storage.checkpoint import read_header
from navrl_daemon.storage.history import HISTORY_FILE, RESULTS_FILE
from navrl_daemon.storage.run_config import CONFIG_FILE, EARLIER_DIR

POINTER = "MIRROR.json"
POINT_PREFIX = "point-"
FORMAT = 1
EXPORT_DIR = "export"


@dataclass(frozen=True)
class MirrorPoint:
    """One resume point: its folder in the mirror and what it holds."""

    folder: str
    iteration: int
    frames: int
    checkpoint: str  # the checkpoint's path in a state dir: checkpoints/ckpt-....nrc
    files: dict[str, dict[str, Any]]  # path in a state dir → {"bytes", "sha256"}

    def to_json(self) -> bytes:
        doc = {"format": FORMAT, **self.__dict__, "written": time.time()}
        return (json.dumps(doc, indent=1) + "\n").encode()


class MirrorLocation(Protocol):
    """Where a mirror lives; paths are relative to its root, `/`-separated."""

    where: str

    def write(self, path: str, data: bytes) -> None:
        """A new file (its folders made); durable when `sync` returns."""
        ...

    def sync(self, folder: str) -> None:
        """Make the files written under `folder` durable."""
        ...

    def replace(self, path: str, data: bytes) -> None:
        """Replace `path` so that a reader sees the old file or the new one, whole."""
        ...

    def read(self, path: str) -> bytes | None:
        """The file's bytes; None when it does not exist."""
        ...

    def names(self) -> list[str]:
        """The names at the root."""
        ...

    def remove(self, name: str) -> None:
        """Delete a name at the root, a folder with everything in it."""
        ...


class LocalFolder:
    """A mirror in a local (or mounted network) folder; fsync where it counts."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.where = str(root)

    def write(self, path: str, data: bytes) -> None:
        target = self.root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    def sync(self, folder: str) -> None:
        top = self.root / folder
        for directory in [*(p for p in top.rglob("*") if p.is_dir()), top]:
            fsync_dir(directory)
        fsync_dir(self.root)

    def replace(self, path: str, data: bytes) -> None:
        write_atomic(self.root / path, data)

    def read(self, path: str) -> bytes | None:
        try:
            return (self.root / path).read_bytes()
        except FileNotFoundError:
            return None

    def names(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir()) if self.root.is_dir() else []

    def remove(self, name: str) -> None:
        target = self.root / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target, ignore_errors=True)
        else:
            target.unlink(missing_ok=True)


class FsspecFolder:
    """A mirror under an fsspec URL (`memory://`, `sftp://`, `s3://`, ...): the pointer is
    written to a temp name and moved, atomic where the file system's move is (a rename on
    SFTP, a single object on an object store)."""

    def __init__(self, url: str) -> None:
        import fsspec

        self.where = url
        self.fs, root = fsspec.core.url_to_fs(url)
        self.root = root.rstrip("/")

    def _path(self, path: str) -> str:
        return f"{self.root}/{path}" if path else self.root

    def write(self, path: str, data: bytes) -> None:
        self.fs.makedirs(self._path(path).rsplit("/", 1)[0], exist_ok=True)
        self.fs.pipe_file(self._path(path), data)

    def sync(self, folder: str) -> None:
        pass  # each write has completed on the server when it returns

    def replace(self, path: str, data: bytes) -> None:
        self.fs.makedirs(self.root, exist_ok=True)
        temp = self._path(f".tmp-{os.getpid()}-{time.time_ns()}")
        self.fs.pipe_file(temp, data)
        self.fs.mv(temp, self._path(path))

    def read(self, path: str) -> bytes | None:
        try:
            return bytes(self.fs.cat_file(self._path(path)))
        except FileNotFoundError:
            return None

    def names(self) -> list[str]:
        try:
            listed = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return []
        return sorted(str(p).rstrip("/").rsplit("/", 1)[-1] for p in listed)

    def remove(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(self._path(name), recursive=True)


def open_location(where: str) -> MirrorLocation:
    """The mirror at `where`: a path, a `file://` URL, or another fsspec URL (needs the
    `mirror` extra: fsspec). ConfigError (78) when it cannot be one."""
    if where.startswith("file://"):
        return LocalFolder(Path(where.removeprefix("file://")).expanduser())
    if "://" not in where:
        return LocalFolder(Path(where).expanduser())
    try:
        import fsspec
    except ImportError:
        raise ConfigError(
            f"checkpoint.mirror = {where!r}: a URL needs fsspec "
            "(pip install 'navrl-daemon[mirror]'); a path needs nothing"
        ) from None
    protocol = where.split("://", 1)[0]
    try:
        fsspec.get_filesystem_class(protocol)
        return FsspecFolder(where)
    except (ValueError, ImportError) as err:
        raise ConfigError(f"checkpoint.mirror = {where!r}: {err}") from None


def resume_files(state_dir: Path, checkpoint: Path) -> dict[str, bytes]:
    """What a run needs to go on from `checkpoint`, by path in the state dir. A JSON-lines
    file is taken up to its last newline (a row being appended is left for the next point)."""
    files = {f"checkpoints/{checkpoint.name}": checkpoint.read_bytes()}
    for name in (HISTORY_FILE, RESULTS_FILE):
        with contextlib.suppress(FileNotFoundError):
            data = (state_dir / name).read_bytes()
            files[name] = data[: data.rfind(b"\n") + 1]
    singles = [state_dir / CONFIG_FILE]
    for folder in (EXPORT_DIR, EARLIER_DIR):
        if (state_dir / folder).is_dir():
            singles += sorted((state_dir / folder).iterdir())
    for path in singles:
        if path.is_file() and not path.name.startswith("."):  # never a temp file
            with contextlib.suppress(FileNotFoundError):
                files[str(path.relative_to(state_dir))] = path.read_bytes()
    return files


class RunMirror:
    """The resume point of one run at `location`."""

    def __init__(self, location: MirrorLocation) -> None:
        self.location = location

    def written_at(self) -> float | None:
        """When the current point was written (time.time()), None without one."""
        data = self.location.read(POINTER)
        try:
            return float(json.loads(data)["written"]) if data is not None else None
        except (ValueError, KeyError, TypeError):
            return None

    def current(self) -> MirrorPoint | None:
        """The current point (None: the mirror holds none yet); DataError when MIRROR.json
        is there but not one of ours."""
        data = self.location.read(POINTER)
        if data is None:
            return None
        try:
            doc = json.loads(data)
            if doc.get("format") != FORMAT:
                raise ValueError(f"format {doc.get('format')!r}, not {FORMAT}")
            return MirrorPoint(
                folder=str(doc["folder"]),
                iteration=int(doc["iteration"]),
                frames=int(doc["frames"]),
                checkpoint=str(doc["checkpoint"]),
                files={str(k): dict(v) for k, v in doc["files"].items()},
            )
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise DataError(f"mirror {self.location.where}: {POINTER} unreadable: {err}") from None

    def write(self, state_dir: Path, checkpoint: Path) -> MirrorPoint | None:
        """Make `checkpoint` and the state dir's other resume files the current point;
        None when the current point already holds exactly these files. A failure
        (OSError and the like) leaves the current point as it was."""
        header = read_header(checkpoint)
        files = resume_files(state_dir, checkpoint)
        entries = {
            name: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            for name, data in files.items()
        }
        try:
            now = self.current()
        except DataError:
            now = None  # replaced by a good one
        if now is not None and now.files == entries:
            return None
        folder = f"{POINT_PREFIX}{header.iteration:09d}-{time.time_ns():x}"
        name = f"checkpoints/{checkpoint.name}"
        point = MirrorPoint(folder, header.iteration, header.frames, name, entries)
        try:
            for name, data in files.items():
                self.location.write(f"{folder}/{name}", data)
            self.location.sync(folder)
        except BaseException:
            with contextlib.suppress(Exception):
                self.location.remove(folder)  # a torn folder; the next write removes it too
            raise
        self.location.replace(POINTER, point.to_json())
        return point

    def remove_others(self, point: MirrorPoint) -> list[str]:
        """Remove every folder but `point`'s (older points, torn writes) and temp files."""
        gone = [
            name
            for name in self.location.names()
            if name != point.folder and name.startswith((POINT_PREFIX, ".tmp-"))
        ]
        for name in gone:
            self.location.remove(name)
        return gone

    def fetch(self, point: MirrorPoint) -> dict[str, bytes]:
        """The point's files, each checked against MIRROR.json; DataError otherwise."""
        files = {}
        for name, entry in point.files.items():
            data = self.location.read(f"{point.folder}/{name}")
            where = f"mirror {self.location.where}: {point.folder}/{name}"
            if data is None:
                raise DataError(f"{where}: missing")
            if len(data) != entry.get("bytes") or (
                hashlib.sha256(data).hexdigest() != entry.get("sha256")
            ):
                raise DataError(
                    f"{where}: {len(data)} bytes that do not match {POINTER} "
                    f"({entry.get('bytes')} bytes, sha256 {entry.get('sha256')})"
                )
            files[name] = data
        return files


def place(files: dict[str, bytes], state_dir: Path, checkpoint: str) -> None:
    """Write a point's files into `state_dir`, each atomically, the checkpoint last: a
    start cut short before it finds the state dir still behind and places them again."""
    for name, data in files.items():
        if name != checkpoint:
            write_atomic(state_dir / name, data)


def staged_checkpoint(directory: Path, data: bytes) -> Path:
    """`data` in a temp file of `directory` (removed at start like any `.tmp-*`): a
    checkpoint's contents are checked from a file."""
    directory.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=".tmp-mirror-", dir=directory)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return Path(temp)
