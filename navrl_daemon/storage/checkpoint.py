"""Checkpoint files (`.nrc`, design §6) and the `checkpoints/` directory that holds them.

Layout: `NRC1` magic, a little-endian u32 header length, a UTF-8 JSON header, then the
payload: `torch.save` bytes of a state of tensors and plain values, cut into `chunk_bytes`
pieces that are LZ4-frame-compressed independently (so a thread pool compresses and
decompresses them in parallel; lz4 releases the GIL) and stored back to back; the header's
`chunks` lists their stored sizes. Loading goes through `torch.load(weights_only=True)`
only, after magic, length and checksum, with every size the header claims bounded by the
file's own size first; a state the writer would refuse (a non-finite tensor) is not loaded.
"""

from __future__ import annotations

import contextlib
import errno
import io
import itertools
import json
import os
import pickle
import re
import struct
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lz4.frame
import numpy as np

from navrl_daemon.errors import DataError
from navrl_daemon.storage.atomic import fsync_dir, write_atomic
from navrl_daemon.storage.codec import CodecError, decompress_frame

if TYPE_CHECKING:
    import torch

MAGIC = b"NRC1"
FORMAT_VERSION = 1
CODEC = "lz4-frame"
MAX_HEADER_BYTES = 1 << 20  # a header is a few KB; a bigger length field means a foreign file
MANIFEST = "MANIFEST.json"
REJECTED = "rejected"  # where files that are not valid checkpoints of this run are moved
# Free space kept beyond a new checkpoint's size when making room: its temp file rounds up
# to whole blocks, and the manifest is rewritten next to it.
ROOM_MARGIN = 256 << 10
CHUNK_BYTES = 4 << 20
_PREFIX = struct.Struct("<4sI")
_FILE_NAME = re.compile(r"ckpt-(\d{9,})\.nrc")
_PLAIN = (int, float, str, bool, type(None))
_INT_FIELDS = (
    "format_version",
    "iteration",
    "frames",
    "policy_version",
    "level",
    "raw_bytes",
    "stored_bytes",
)


@dataclass(frozen=True)
class CheckpointHeader:
    format_version: int
    iteration: int
    frames: int
    policy_version: int
    created: float
    codec: str
    level: int
    raw_bytes: int
    stored_bytes: int
    checksum: str
    chunks: list[int]
    meta: dict[str, Any] = field(default_factory=dict)


class _Invalid(Exception):
    """Why a file is not a loadable checkpoint; surfaces as DataError or a (path, why) pair."""


def _checksum(payload: bytes) -> str:
    return f"crc32:{zlib.crc32(payload):08x}"


def _check_state(value: Any, path: str) -> None:
    """Refuse what `torch.load(weights_only=True)` could not read back, sparse and meta
    tensors, and non-finite floats: the writer never writes such a state, and a file that
    holds one is not a checkpoint."""
    import torch  # here, not at the top: `status` and `checkpoints list` read headers only

    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided or value.is_nested:
            raise TypeError(f"state {path}: a {value.layout} tensor; a checkpoint's are dense")
        if value.is_meta:
            raise TypeError(f"state {path}: a meta tensor, a shape without data")
        if (value.is_floating_point() or value.is_complex()) and not _all_finite(value):
            raise ValueError(f"{path}: non-finite values; a checkpoint never holds them")
    elif type(value) in (dict, OrderedDict):
        for k, v in value.items():
            if not isinstance(k, str | int):
                raise TypeError(f"state {path}: key {k!r} is not a str or int")
            _check_state(v, f"{path}.{k}")
    elif type(value) in (list, tuple):
        for i, v in enumerate(value):
            _check_state(v, f"{path}.{i}")
    elif type(value) not in _PLAIN:  # exact types: subclasses (TorchVersion) do not load
        raise TypeError(f"state {path}: {type(value).__name__} is not a tensor or plain value")


def _all_finite(t: torch.Tensor) -> bool:
    """Through numpy where it can: this runs on the writer's thread, and a torch CPU kernel
    there would start a second OpenMP team that slows the trainer's (runtime/compute.py)."""
    import torch

    if t.device.type == "cpu" and t.dtype not in (torch.bfloat16, torch.float16):
        return bool(np.isfinite(t.detach().numpy()).all())
    return bool(torch.isfinite(t).all())


def encode_checkpoint(
    state: dict[str, Any],
    *,
    iteration: int,
    frames: int,
    policy_version: int,
    level: int = 0,
    meta: dict[str, Any] | None = None,
    executor: Executor | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> bytes:
    """Serialize `state` into one `.nrc` blob (level 0: LZ4 fast, 3..16: LZ4 HC); chunks
    are compressed on `executor` when given."""
    if type(state) not in (dict, OrderedDict):
        raise TypeError("checkpoint state must be a dict")
    if not 0 <= level <= lz4.frame.COMPRESSIONLEVEL_MAX:
        raise ValueError(f"compression level {level} not in 0..{lz4.frame.COMPRESSIONLEVEL_MAX}")
    counters = {"iteration": iteration, "frames": frames, "policy_version": policy_version}
    for name, value in counters.items():
        if type(value) is not int or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    _check_state(state, "state")
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    import torch

    buf = io.BytesIO()
    torch.save(state, buf)
    raw = buf.getbuffer()
    pieces = [raw[i : i + chunk_bytes] for i in range(0, len(raw), chunk_bytes)] or [raw]

    def compress(piece: memoryview) -> bytes:
        return lz4.frame.compress(piece, compression_level=level)

    frames = list(executor.map(compress, pieces) if executor else map(compress, pieces))
    payload = b"".join(frames)
    header = {
        "format_version": FORMAT_VERSION,
        **counters,
        "created": time.time(),
        "codec": CODEC,
        "level": level,
        "raw_bytes": len(raw),
        "stored_bytes": len(payload),
        "checksum": _checksum(payload),
        "chunks": [len(f) for f in frames],
        "meta": dict(meta or {}),
    }
    head = json.dumps(header, sort_keys=True, allow_nan=False).encode()  # ValueError on NaN meta
    if len(head) > MAX_HEADER_BYTES:
        raise ValueError(f"checkpoint header is {len(head)} bytes (max {MAX_HEADER_BYTES})")
    return _PREFIX.pack(MAGIC, len(head)) + head + payload


def _read_header(f: io.BufferedIOBase) -> CheckpointHeader:
    prefix = f.read(_PREFIX.size)
    if not prefix:
        raise _Invalid("not a navrl checkpoint (empty file)")
    if prefix[:4] != MAGIC[: len(prefix[:4])]:
        raise _Invalid("not a navrl checkpoint (bad magic)")
    if len(prefix) < _PREFIX.size:
        raise _Invalid(f"truncated: {len(prefix)} bytes, shorter than magic and header length")
    _, n = _PREFIX.unpack(prefix)
    if n > MAX_HEADER_BYTES:
        raise _Invalid(f"bad header length {n} (max {MAX_HEADER_BYTES})")
    head = f.read(n)
    if len(head) < n:
        raise _Invalid(f"truncated: header has {len(head)} of {n} bytes")
    try:
        fields = json.loads(head.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _Invalid(f"bad header: not UTF-8 JSON ({e})") from None
    if not isinstance(fields, dict):
        raise _Invalid("bad header: not a JSON object")
    if fields.get("format_version") != FORMAT_VERSION:
        raise _Invalid(f"unsupported format_version {fields.get('format_version')!r}")
    missing = sorted(k for k in CheckpointHeader.__dataclass_fields__ if k not in fields)
    if missing:
        raise _Invalid(f"bad header: missing {missing}")
    wrong = [k for k in _INT_FIELDS if type(fields[k]) is not int or fields[k] < 0]
    chunks = fields["chunks"]
    if not isinstance(chunks, list) or not all(type(c) is int and c > 0 for c in chunks):
        wrong.append("chunks")
    if wrong or not isinstance(fields["meta"], dict) or not isinstance(fields["checksum"], str):
        raise _Invalid(f"bad header: wrong types ({wrong or ['meta/checksum']})")
    if sum(chunks) != fields["stored_bytes"]:
        raise _Invalid(f"bad header: chunks add up to {sum(chunks)}, not stored_bytes")
    if fields["codec"] != CODEC:
        raise _Invalid(f"unsupported codec {fields['codec']!r}")
    # Unknown keys are ignored so that a later writer may add some without a new version.
    return CheckpointHeader(**{k: fields[k] for k in CheckpointHeader.__dataclass_fields__})


def _decompress(header: CheckpointHeader, payload: bytes, executor: Executor | None) -> bytes:
    view = memoryview(payload)
    starts = [0]
    for size in header.chunks:
        starts.append(starts[-1] + size)
    pieces = [view[a:b] for a, b in itertools.pairwise(starts)]

    def decompress(piece: memoryview) -> bytearray:
        return decompress_frame(piece, header.raw_bytes)  # no chunk holds more than all

    try:
        return b"".join(executor.map(decompress, pieces) if executor else map(decompress, pieces))
    except CodecError as e:
        raise _Invalid(f"payload: {e}") from None


def _load(
    path: Path, map_location: Any, executor: Executor | None = None
) -> tuple[CheckpointHeader, dict[str, Any]]:
    named = _FILE_NAME.fullmatch(path.name)
    if named is not None and path.is_symlink():
        # A run writes its checkpoints itself: a link could name any iteration (and its
        # target is removed by the run's own pruning).
        raise _Invalid("a symbolic link, not a file the run wrote")
    try:
        with open(path, "rb") as f:
            header = _read_header(f)
            # The header's sizes are claims: the file's own size bounds what is read.
            held = os.fstat(f.fileno()).st_size - f.tell()
            payload = f.read(max(0, min(held, header.stored_bytes)))
    except OSError as e:
        raise _Invalid(f"unreadable: {e.strerror or e}") from None
    if len(payload) < header.stored_bytes:
        raise _Invalid(f"truncated: payload has {len(payload)} of {header.stored_bytes} bytes")
    if held > header.stored_bytes:
        raise _Invalid(f"trailing data after the {header.stored_bytes}-byte payload")
    actual = _checksum(payload)
    if actual != header.checksum:
        raise _Invalid(f"checksum mismatch (header {header.checksum}, payload {actual})")
    if named is not None and int(named.group(1)) != header.iteration:
        # A copy or a rename: resuming from it would cut the history back to its iteration.
        raise _Invalid(
            f"named for iteration {int(named.group(1))}, but it holds iteration "
            f"{header.iteration} (a copy or a rename)"
        )
    raw = _decompress(header, payload, executor)
    if len(raw) != header.raw_bytes:
        raise _Invalid(f"raw size mismatch ({len(raw)} bytes, header says {header.raw_bytes})")
    import torch

    try:
        state = torch.load(io.BytesIO(raw), weights_only=True, map_location=map_location)
    except Exception as e:  # the trust boundary: whatever torch refuses, we refuse
        raise _Invalid(
            f"payload refused by torch.load(weights_only=True): {torch_refusal(e)}"
        ) from None
    if not isinstance(state, dict):
        raise _Invalid(f"payload is a {type(state).__name__}, not a dict")
    try:
        _check_state(state, "state")  # the writer's own check: a NaN weight never loads
    except (TypeError, ValueError) as e:
        raise _Invalid(str(e)) from None
    return header, state


def parse_header(data: bytes) -> CheckpointHeader:
    """The header of an encoded checkpoint held in memory (`encode_checkpoint` output)."""
    try:
        return _read_header(io.BytesIO(data))
    except _Invalid as e:
        raise DataError(f"encoded checkpoint: {e}") from None


def torch_refusal(err: Exception) -> str:
    """Why `torch.load(weights_only=True)` refused, without the advice around it (which
    suggests weights_only=False, i.e. running whatever code the file holds, or
    allowlisting what the file names)."""
    # Paragraphs and sentences; "... error:" ends the advice to file an issue, and the
    # reason follows it.
    pieces = re.split(r"\n\s*\n|(?<=[.!?])\s+|(?<=error:)\s+", str(err))
    sentences = [" ".join(p.split()) for p in pieces]
    reason = " ".join(s for s in sentences if s and not any(a in s for a in _ADVICE))
    if not isinstance(err, pickle.UnpicklingError | RuntimeError):
        reason = f"{type(err).__name__}: {reason}"  # a bare KeyError says only '101'
    return (reason or type(err).__name__)[:300]


# Sentences of torch's refusals that give advice, not the reason.
_ADVICE = (
    "weights_only",
    "allowlist",
    "safe_globals",
    "Please ",
    "Check the documentation",
    "trusted source",
    "internal miniz error",
    "This can happen if",
)


def read_header(path: Path) -> CheckpointHeader:
    """The header alone (magic and length checks only; the payload is not read)."""
    try:
        with open(path, "rb") as f:
            return _read_header(f)
    except OSError as e:
        raise DataError(f"checkpoint {path}: unreadable: {e.strerror or e}") from None
    except _Invalid as e:
        raise DataError(f"checkpoint {path}: {e}") from None


def load_checkpoint(
    path: Path, map_location: Any = "cpu"
) -> tuple[CheckpointHeader, dict[str, Any]]:
    """Header and state of a checkpoint file; DataError (exit 65) for anything not valid."""
    try:
        return _load(Path(path), map_location)
    except _Invalid as e:
        raise DataError(f"checkpoint {path}: {e}") from None


# Whether a loaded checkpoint's contents fit the run that would use it: None, or why not.
# The run composes it from its config (pipeline/resume.py `CheckpointFit`).
Accept = Callable[[CheckpointHeader, dict[str, Any]], "str | None"]


def verify(paths: Iterable[Path], accept: Accept | None = None) -> list[tuple[Path, str | None]]:
    """(path, None) for each loadable checkpoint that `accept` takes, (path, why) for each
    that is not."""
    return [(Path(path), _problem(Path(path), accept)) for path in paths]


def _problem(path: Path, accept: Accept | None) -> str | None:
    try:
        header, state = _load(path, "cpu")
    except _Invalid as e:
        return str(e)
    return accept(header, state) if accept is not None else None


def checkpoint_iteration(path: Path) -> int:
    """The iteration in a checkpoint file's name (`ckpt-000001234.nrc`: 1234)."""
    match = _FILE_NAME.fullmatch(path.name)
    assert match is not None
    return int(match.group(1))


class CheckpointDir:
    """`STATE_DIR/checkpoints/`: the files on disk are the truth, MANIFEST.json a hint.

    A file counts as a checkpoint when it loads (magic, lengths, checksum, weights-only
    load) and `accept` takes its contents (a run's config: pipeline/resume.py). Whether a
    file counts is remembered per file version (inode, size, times), so each is read once.
    """

    def __init__(self, path: Path, accept: Accept | None = None) -> None:
        self.path = Path(path)
        self.accept = accept
        self.skipped: list[tuple[Path, str]] = []  # set by newest_valid(): (file, why)
        self.rejected: list[tuple[Path, str]] = []  # set by prune(): moved aside, and why
        self.made_room: list[Path] = []  # set by write(): deleted for lack of disk space
        self.manifest_error: OSError | None = None  # set by _write_manifest()
        self._known: dict[Path, tuple[tuple[int, ...], str | None]] = {}

    def write(self, data: bytes, iteration: int) -> Path:
        """Durably store one encoded checkpoint, then point the manifest at it.

        Low on disk space, older checkpoints are deleted first (oldest first, never the
        newest valid one), before the write and again if the write still hits ENOSPC;
        `made_room` lists them."""
        if data[:4] != MAGIC:
            raise ValueError("data is not an encoded checkpoint (see encode_checkpoint)")
        if iteration < 0:
            raise ValueError(f"iteration {iteration} is negative")
        target = self.path / f"ckpt-{iteration:09d}.nrc"
        self.made_room = self._make_room(len(data), target)
        try:
            try:
                write_atomic(target, data)
            except OSError as err:
                if err.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                freed = self._make_room(len(data), target, down_to_one=True)
                if not freed:
                    raise
                self.made_room += freed
                write_atomic(target, data)
            self._remember(target, None)
        finally:  # written or not, files may have gone to make room
            self._write_manifest()
        return target

    def holding(self, iteration: int) -> Path | None:
        """The valid checkpoint of `iteration` (None: there is none)."""
        path = self.path / f"ckpt-{iteration:09d}.nrc"
        return path if path.is_file() and self.problem(path) is None else None

    def problem(self, path: Path) -> str | None:
        """Why `path` is not a checkpoint this directory's run can use (None: it is one)."""
        try:
            signature = _signature(path)
        except OSError:
            return _problem(path, self.accept)  # says why it cannot be read
        known = self._known.get(path)
        if known is not None and known[0] == signature:
            return known[1]
        why = _problem(path, self.accept)
        self._known[path] = (signature, why)
        return why

    def _remember(self, path: Path, why: str | None) -> None:
        try:
            self._known[path] = (_signature(path), why)
        except OSError:
            self._known.pop(path, None)

    def _make_room(self, nbytes: int, target: Path, *, down_to_one: bool = False) -> list[Path]:
        """Delete the oldest checkpoints until `nbytes` (and a margin) fit on the disk, or,
        `down_to_one`, all but the newest valid one; never that one, never `target`."""
        if not self.path.is_dir():
            return []
        need = nbytes + ROOM_MARGIN
        if not down_to_one and _free_bytes(self.path) >= need:
            return []
        files = self.files()
        newest = next((p for p in reversed(files) if self.problem(p) is None), None)
        if newest is None:
            return []  # nothing valid: nothing may go
        deleted = []
        for path in files:
            if path in (newest, target):
                continue
            if not down_to_one and _free_bytes(self.path) >= need:
                break
            path.unlink(missing_ok=True)
            deleted.append(path)
        if deleted:
            fsync_dir(self.path)
        return deleted

    def files(self) -> list[Path]:
        """Checkpoint files, oldest iteration first; temp files and strangers are not listed."""
        if not self.path.is_dir():
            return []
        found = [p for p in self.path.iterdir() if _FILE_NAME.fullmatch(p.name) and p.is_file()]
        return sorted(found, key=checkpoint_iteration)

    def newest_valid(self) -> tuple[Path, CheckpointHeader, dict[str, Any]] | None:
        """Load the newest file that passes every check (`accept` too); the ones skipped
        go to `skipped`."""
        self.skipped = []
        for path in reversed(self.files()):
            try:
                header, state = _load(path, "cpu")
                why = self.accept(header, state) if self.accept is not None else None
            except _Invalid as e:
                why = str(e)
            self._remember(path, why)
            if why is not None:
                self.skipped.append((path, why))
                continue
            return path, header, state
        return None

    def reject(self, paths: Iterable[tuple[Path, str]]) -> list[tuple[Path, str]]:
        """Move files that are not valid checkpoints into `rejected/`, where they never
        count (a user may still want them: nothing is deleted); returns those moved."""
        moved = []
        for path, why in paths:
            aside = self.path / REJECTED / path.name
            aside.parent.mkdir(exist_ok=True)
            n = 0
            while aside.exists():
                n += 1
                aside = aside.with_name(f"{path.name}.{n}")
            try:
                os.rename(path, aside)
            except FileNotFoundError:
                continue
            self._known.pop(path, None)
            moved.append((path, why))
        if moved:
            fsync_dir(self.path)
        return moved

    def remove_temp_files(self) -> list[Path]:
        """Delete `.tmp-*` left by a crash mid-write; call only while no write is running."""
        if not self.path.is_dir():
            return []
        removed = sorted(p for p in self.path.glob(".tmp-*") if p.is_file())
        for p in removed:
            p.unlink(missing_ok=True)
        if removed:
            fsync_dir(self.path)
        return removed

    def prune(
        self,
        keep_last: int,
        keep_best: int = 0,
        scores: dict[Path, float] | None = None,
        newest_valid: Path | None = None,
        keep_every: int = 0,
    ) -> list[Path]:
        """Delete all but the `keep_last` newest valid files, the `keep_best` best-scored
        valid ones, those of an iteration that is a multiple of `keep_every` (if > 0) and
        the newest valid one; returns the deleted paths. Files that are not
        valid never take a place: they are moved aside (`reject`; listed in `rejected`).
        With no valid file at all, nothing is deleted or moved. `newest_valid`: the caller
        knows it (it just wrote it), so that file is not re-read."""
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        if keep_best < 0:
            raise ValueError(f"keep_best must be >= 0, got {keep_best}")
        if keep_every < 0:
            raise ValueError(f"keep_every must be >= 0, got {keep_every}")
        self.rejected = []
        files = self.files()
        problems = {p: (None if p == newest_valid else self.problem(p)) for p in files}
        valid = [p for p in files if problems[p] is None]
        if not valid:
            return []
        self.rejected = self.reject((p, why) for p, why in problems.items() if why is not None)
        by_name = {Path(p).name: s for p, s in (scores or {}).items()}
        scored = sorted((p for p in valid if p.name in by_name), key=lambda p: -by_name[p.name])
        milestones = (
            [p for p in valid if checkpoint_iteration(p) % keep_every == 0] if keep_every else []
        )
        keep = {*valid[-keep_last:], *scored[:keep_best], *milestones, valid[-1]}
        doomed = [p for p in valid if p not in keep]
        # Manifest first: a crash mid-deletion leaves extra files, never a manifest naming gaps.
        self._write_manifest([p for p in valid if p in keep])
        for p in doomed:
            p.unlink(missing_ok=True)
            self._known.pop(p, None)
        if doomed:
            fsync_dir(self.path)
            if self.manifest_error is not None:  # a full disk: the deletions made room
                self._write_manifest()
        return doomed

    def _write_manifest(self, files: list[Path] | None = None) -> None:
        """Point MANIFEST.json at `files` (default: those on disk) and the newest valid one.

        When it cannot be written (a full disk), an old manifest that says otherwise is
        removed, so none ever names a deleted file or misses the newest; the next write or
        prune writes it again. `manifest_error`: why the last attempt failed (None: written)."""
        files = self.files() if files is None else files
        latest = next((p.name for p in reversed(files) if self.problem(p) is None), None)
        doc = {"latest": latest, "files": [p.name for p in files]}
        path = self.path / MANIFEST
        try:
            write_atomic(
                path, json.dumps(doc | {"updated": time.time()}, indent=1).encode() + b"\n"
            )
            self.manifest_error = None
        except OSError as err:
            self.manifest_error = err
            try:
                old = json.loads(path.read_bytes())
                still_true = isinstance(old, dict) and {k: old.get(k) for k in doc} == doc
            except (OSError, ValueError):
                still_true = False
            if not still_true:
                with contextlib.suppress(OSError):
                    path.unlink(missing_ok=True)


def _signature(path: Path) -> tuple[int, ...]:
    st = os.stat(path)
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _free_bytes(directory: Path) -> int:
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


__all__ = [
    "MAGIC",
    "CheckpointDir",
    "CheckpointHeader",
    "encode_checkpoint",
    "load_checkpoint",
    "parse_header",
    "read_header",
    "verify",
]
