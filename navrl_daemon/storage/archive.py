"""Rollout archive files (`rollouts-<seq:06d>.h5`, design §6): writer, reader, verify.

Layout (plain HDF5, no pickle: datasets, attributes and JSON strings only):

```
/                 attrs: format = "navrl-archive", version, codec, mode, level, created,
                         complete (true only after a clean close), keys (JSON: path,
                         dtype, step shape, filter of every key, in column order)
/index/iteration       int64 [S]     one row per segment: one env's T steps of one rollout
/index/env             int32 [S]
/index/policy_version  int64 [S]
/index/length          int32 [S]     steps in the segment
/index/raw_bytes       int64 [S]     all keys, before compression
/index/offset          uint64 [S, B] where the segment's blob starts in blob dataset b
/index/stored_bytes    uint64 [S, B] blob size
/index/crc32           uint32 [S, B] CRC-32 of the blob
/index/row_crc32       uint32 [S]    CRC-32 of the row's other columns (`row_checksums`);
                                     absent in files written before it existed, whose
                                     iteration, env, policy_version and raw_bytes
                                     columns nothing can check
version 2 (written now), B = 1:
/segments              uint8 [bytes] every key of a segment in one blob (codec.PackedCodec),
                                     segments back to back; attrs packing (key paths in
                                     pack order)
version 1 (still read), B = K, one blob dataset per key:
/blobs/<a>/<b>/<c>     uint8 [bytes] compressed segments of one key back to back;
                                     attrs dtype, shape (per step), filter
```

Crash safety: the file is written in HDF5's SWMR mode, whose ordered metadata writes
keep it readable at every instant. Each append writes the blobs, then every index column
but `length`, flushes, then writes `length` (fill value -1) and flushes again: a row
counts only once its length is there, so after a kill -9 the index names only segments
whose bytes are out. A file killed mid-write stays flagged as open for writing; readers
then open it with `swmr=True`, and trust no row whose blob lies beyond its dataset's end.
A row that fails its row checksum is not trusted either: readers (and the archiver
working out where a restart goes on) skip it and keep the rows around it; `verify` fails.
A file that would read others (external links, virtual datasets) or whose datasets claim
more than it can hold is refused whole (storage/hdf5_input.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from navrl_daemon.errors import DataError
from navrl_daemon.storage.codec import (
    CODEC,
    CodecError,
    Filter,
    KeyCodec,
    Mode,
    PackedCodec,
    filter_for,
)
from navrl_daemon.storage.hdf5_input import check_claimed_size, open_confined
from navrl_daemon.storage.segment import DecodedSegment, SegmentLayout

FORMAT = "navrl-archive"
FORMAT_VERSION = 2  # what the writer writes
READ_VERSIONS = (1, 2)
PACKED_DATASET = "segments"
FILE_NAME = re.compile(r"rollouts-(\d{6,})\.h5")
TEMP_PREFIX = ".tmp-"  # a file being created (see ArchiveWriter._create)
ROW_FIELDS = {
    "iteration": np.int64,
    "env": np.int32,
    "policy_version": np.int64,
    "length": np.int32,
    "raw_bytes": np.int64,
}
KEY_FIELDS = {"offset": np.uint64, "stored_bytes": np.uint64, "crc32": np.uint32}
ROW_CHECKSUM = "row_crc32"  # the index column that checks the others (optional: older files)
INDEX_CHUNK_ROWS = 1024
# Blob chunks: about an eighth of what one rollout stores of the key, so the unused tail
# of a file's last chunk stays small, within these bounds.
MIN_BLOB_CHUNK, MAX_BLOB_CHUNK = 4096, 256 << 10


def archive_name(seq: int) -> str:
    return f"rollouts-{seq:06d}.h5"


def archive_files(directory: Path) -> list[Path]:
    """The archive files of a directory, oldest (lowest sequence number) first."""
    if not directory.is_dir():
        return []
    found = [
        (int(m.group(1)), p) for p in directory.iterdir() if (m := FILE_NAME.fullmatch(p.name))
    ]
    return [p for _, p in sorted(found)]


def remove_temp_files(directory: Path) -> list[Path]:
    """Delete the half-created files a kill -9 left (`ArchiveWriter._create`); call only
    while no writer runs."""
    if not directory.is_dir():
        return []
    removed = sorted(p for p in directory.glob(TEMP_PREFIX + "rollouts-*") if p.is_file())
    for p in removed:
        p.unlink(missing_ok=True)
    return removed


def next_sequence(directory: Path) -> int:
    """The sequence number after the newest archive file's (0 in an empty directory)."""
    files = archive_files(directory)
    match = FILE_NAME.fullmatch(files[-1].name) if files else None
    return int(match.group(1)) + 1 if match else 0


def last_archived_iteration(
    directory: Path, on_bad: Callable[[DataError], None] = lambda e: None
) -> int | None:
    """The highest iteration in the newest archive file that holds a whole segment with a
    sound index row (None when there is none). Unreadable files are passed over and rows
    that fail their checksum left out (`ArchiveFile.open`), each reported to `on_bad`."""
    for path in reversed(archive_files(directory)):
        try:
            with ArchiveFile.open(path) as f:
                if (damage := f.index_damage()) is not None:
                    on_bad(damage)
                if f.segments:
                    return int(f.rows["iteration"].max())
        except DataError as e:
            on_bad(e)
    return None


# ---------------------------------------------------------------------------- schema


@dataclass(frozen=True)
class KeySpec:
    """One rollout key: its `a/b/c` path and how its segments are coded."""

    path: str
    codec: KeyCodec

    @property
    def key(self) -> tuple[str, ...]:
        return tuple(self.path.split("/"))

    def to_json(self) -> dict[str, Any]:
        c = self.codec
        return {
            "path": self.path,
            "dtype": c.dtype.str,
            "shape": list(c.step_shape),
            "filter": c.filter,
        }


@dataclass(frozen=True)
class Schema:
    """The keys of an archive in column order, with the mode and level of all of them, and
    the format version their segments are stored in (2: one packed blob; 1: one per key)."""

    keys: tuple[KeySpec, ...]
    mode: Mode = "episode"
    level: int = 0
    version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        if self.version not in READ_VERSIONS:
            raise ValueError(f"archive format version {self.version} not one of {READ_VERSIONS}")

    @cached_property
    def layout(self) -> SegmentLayout:
        return SegmentLayout([k.path for k in self.keys], [k.codec for k in self.keys])

    @cached_property
    def packed(self) -> PackedCodec:
        return PackedCodec(tuple(k.codec for k in self.keys), self.mode, self.level)

    @property
    def blob_datasets(self) -> list[str]:
        """The HDF5 datasets holding the blobs, one per column of the key index fields."""
        if self.version == 1:
            return [f"blobs/{k.path}" for k in self.keys]
        return [PACKED_DATASET]

    def blob_label(self, column: int) -> str:
        return f"key {self.keys[column].path}" if self.version == 1 else "packed blob"

    def same_keys(self, other: Schema) -> bool:
        """Same paths, dtypes and step shapes: segments that sample together (the codec,
        mode and version may differ; each file decodes its own)."""

        def keys(schema: Schema) -> list[tuple[str, str, tuple[int, ...]]]:
            return [(k.path, k.codec.dtype.str, k.codec.step_shape) for k in schema.keys]

        return keys(self) == keys(other)

    def encode(self, segment: Sequence[np.ndarray]) -> list[bytes]:
        """One segment's `[T, *step_shape]` arrays in column order → its blobs."""
        if self.version == 1:
            return [k.codec.encode(a) for k, a in zip(self.keys, segment, strict=True)]
        return [self.packed.encode(segment)]

    def decode(self, blobs: Sequence[bytes], length: int) -> DecodedSegment:
        """The blobs of one segment → its decoded bytes; CodecError names a bad key."""
        if self.version == 1:
            arrays = {}
            for spec, blob in zip(self.keys, blobs, strict=True):
                try:
                    arrays[spec.path] = spec.codec.decode(blob, length)
                except CodecError as e:
                    raise CodecError(f"key {spec.path}: {e}") from None
            return DecodedSegment(self.layout.pack(arrays, length), length, self.layout)
        (blob,) = blobs
        return DecodedSegment(self.packed.decode(blob, length), length, self.layout)

    @classmethod
    def for_rollout(
        cls,
        arrays: Mapping[str, np.ndarray],
        *,
        mode: Mode = "episode",
        level: int = 0,
        default_filter: Filter = "none",
        key_filters: Sequence[tuple[str, Filter]] = (),
        version: int = FORMAT_VERSION,
    ) -> Schema:
        """The schema of `[N, T, ...]` arrays keyed by `a/b/c` path."""
        keys = []
        for path, array in arrays.items():
            name = filter_for(path, array.dtype, default_filter, key_filters)
            if mode == "frame" and name.startswith("delta"):
                name = "shuffle" if name.endswith("shuffle") else "none"
            codec = KeyCodec(array.dtype, tuple(array.shape[2:]), name, mode, level)
            keys.append(KeySpec(path, codec))
        return cls(tuple(keys), mode, level, version)

    def to_json(self) -> str:
        return json.dumps([k.to_json() for k in self.keys])

    @classmethod
    def from_json(cls, text: str, mode: Mode, level: int, version: int) -> Schema:
        keys = []
        for item in json.loads(text):
            dtype = np.dtype(str(item["dtype"]))
            if dtype.hasobject:
                raise ValueError(f"key {item['path']}: object dtype")
            codec = KeyCodec(
                dtype, tuple(int(n) for n in item["shape"]), item["filter"], mode, level
            )
            keys.append(KeySpec(str(item["path"]), codec))
        return cls(tuple(keys), mode, level, version)


# ---------------------------------------------------------------------------- encode


@dataclass
class EncodedSegment:
    """One env's T steps of one rollout, every key compressed, ready to append."""

    iteration: int
    env: int
    policy_version: int
    length: int
    raw_bytes: int
    blobs: list[bytes]

    @property
    def stored_bytes(self) -> int:
        return sum(map(len, self.blobs))


def encode_segments(
    schema: Schema,
    arrays: Mapping[str, np.ndarray],
    envs: Iterable[int],
    *,
    iteration: int,
    policy_version: int,
) -> list[EncodedSegment]:
    """Compress the given envs of `[N, T, ...]` arrays: one segment per env (thread-safe)."""
    out = []
    for env in envs:
        blobs = schema.encode([arrays[spec.path][env] for spec in schema.keys])
        length = arrays[schema.keys[0].path].shape[1]
        raw = sum(arrays[spec.path][env].nbytes for spec in schema.keys)
        out.append(EncodedSegment(iteration, env, policy_version, length, raw, blobs))
    return out


# ---------------------------------------------------------------------------- writer


class ArchiveWriter:
    """Appends segments to one new archive file; `close` marks it complete."""

    def __init__(self, path: Path, schema: Schema) -> None:
        if not schema.keys:
            raise ValueError("an archive needs at least one key")
        self.path = path
        self.schema = schema
        self.segments = 0
        self.raw_bytes = 0
        self.stored_bytes = 0
        self._file: h5py.File | None = None
        self._blobs: list[h5py.Dataset] = []
        self._rows: dict[str, h5py.Dataset] = {}
        self._ends = np.zeros(len(schema.blob_datasets), dtype=np.uint64)

    def _create(self, first: Sequence[EncodedSegment]) -> h5py.File:
        """Create every object now: SWMR mode allows no new ones later. The file is built
        under a temp name and renamed once it is readable, so a kill -9 mid-creation leaves
        only a temp file (which no reader lists), never a broken archive."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            raise FileExistsError(f"archive {self.path} already exists")
        staging = self.path.with_name(TEMP_PREFIX + self.path.name)
        f = h5py.File(staging, "w", libver="latest")
        try:
            f.attrs["format"] = FORMAT
            f.attrs["version"] = self.schema.version
            f.attrs["codec"] = CODEC
            f.attrs["mode"] = self.schema.mode
            f.attrs["level"] = self.schema.level
            f.attrs["created"] = time.time()
            f.attrs["keys"] = self.schema.to_json()
            f.attrs["complete"] = False
            index = f.create_group("index")
            for name, dtype in ROW_FIELDS.items():
                self._rows[name] = index.create_dataset(
                    name,
                    (0,),
                    dtype,
                    maxshape=(None,),
                    chunks=(INDEX_CHUNK_ROWS,),
                    # A length row whose data never made it reads -1: not committed.
                    fillvalue=-1 if name == "length" else 0,
                )
            self._rows[ROW_CHECKSUM] = index.create_dataset(
                ROW_CHECKSUM, (0,), np.uint32, maxshape=(None,), chunks=(INDEX_CHUNK_ROWS,)
            )
            k = len(self.schema.blob_datasets)
            for name, dtype in KEY_FIELDS.items():
                self._rows[name] = index.create_dataset(
                    name, (0, k), dtype, maxshape=(None, k), chunks=(INDEX_CHUNK_ROWS // 8, k)
                )
            for i, name in enumerate(self.schema.blob_datasets):
                eighth = sum(len(s.blobs[i]) for s in first) // 8
                chunk = int(
                    np.clip(1 << max(eighth, 1).bit_length(), MIN_BLOB_CHUNK, MAX_BLOB_CHUNK)
                )
                ds = f.create_dataset(name, (0,), np.uint8, maxshape=(None,), chunks=(chunk,))
                if self.schema.version == 1:
                    ds.attrs.update(self.schema.keys[i].to_json())
                else:
                    ds.attrs["packing"] = json.dumps([p.path for p in self.schema.layout.packed])
                self._blobs.append(ds)
            f.swmr_mode = True
            f.flush()
            os.rename(staging, self.path)
        except BaseException:
            f.close()
            staging.unlink(missing_ok=True)
            raise
        return f

    def append(self, segments: Sequence[EncodedSegment]) -> int:
        """Append segments (blobs, index rows, `length` last); returns stored bytes."""
        if not segments:
            return 0
        if self._file is None:
            self._file = self._create(segments)
        n, k = len(segments), len(self._blobs)
        if any(len(s.blobs) != k for s in segments):
            raise ValueError(f"every segment needs {k} blobs (format {self.schema.version})")
        offsets = np.zeros((n, k), dtype=np.uint64)
        sizes = np.zeros((n, k), dtype=np.uint64)
        crcs = np.zeros((n, k), dtype=np.uint32)
        for j, ds in enumerate(self._blobs):
            parts = [s.blobs[j] for s in segments]
            sizes[:, j] = [len(p) for p in parts]
            crcs[:, j] = [zlib.crc32(p) for p in parts]
            offsets[:, j] = self._ends[j] + np.concatenate([[0], np.cumsum(sizes[:-1, j])])
            end = int(self._ends[j] + sizes[:, j].sum())
            ds.resize((end,))
            ds[int(self._ends[j]) : end] = np.frombuffer(b"".join(parts), dtype=np.uint8)
            self._ends[j] = end
        rows: dict[str, Any] = {
            "iteration": [s.iteration for s in segments],
            "env": [s.env for s in segments],
            "policy_version": [s.policy_version for s in segments],
            "length": [s.length for s in segments],
            "raw_bytes": [s.raw_bytes for s in segments],
            "offset": offsets,
            "stored_bytes": sizes,
            "crc32": crcs,
        }
        rows[ROW_CHECKSUM] = row_checksums(rows)
        start, stop = self.segments, self.segments + n
        # `length` commits the rows: written only once everything they point to is out.
        for name in [*(r for r in self._rows if r != "length"), "length"]:
            if name == "length":
                self._file.flush()
            self._rows[name].resize(stop, axis=0)
            self._rows[name][start:stop] = rows[name]
        self._file.flush()
        self.segments = stop
        self.raw_bytes += sum(s.raw_bytes for s in segments)
        stored = int(sizes.sum())
        self.stored_bytes += stored
        return stored

    @property
    def file_bytes(self) -> int:
        return self.path.stat().st_size if self._file is not None else 0

    def close(self) -> None:
        """Mark the file complete and close it (a no-op for a writer that wrote nothing)."""
        if self._file is None:
            return
        f, self._file = self._file, None
        try:
            f.attrs.modify("complete", True)
            f.flush()
        finally:
            f.close()
        with open(self.path, "rb") as fh:  # the file's bytes on disk before we report it closed
            os.fsync(fh.fileno())


# ---------------------------------------------------------------------------- reader


@dataclass
class ArchiveFile:
    """One archive file opened for reading: its schema and the index of its whole segments.

    Opening checks the format and the index; blobs are read and decoded on demand.
    Every problem surfaces as `DataError` naming the file.
    """

    path: Path
    schema: Schema
    complete: bool
    created: float
    rows: dict[str, np.ndarray]  # ROW_FIELDS [S] and KEY_FIELDS [S, K], whole segments only
    torn: int = 0  # rows written after the last whole segment (a kill -9 mid-append)
    bad_rows: list[int] = field(default_factory=list)  # left out: they fail their checksum
    _untrusted: dict[str, np.ndarray] = field(default_factory=dict, repr=False)  # those rows
    _file: h5py.File | None = field(default=None, repr=False)
    _blobs: list[h5py.Dataset] = field(default_factory=list, repr=False)
    _chunks: list[ChunkMap | None] = field(default_factory=list, repr=False)
    _fd: int | None = field(default=None, repr=False)  # for pread, shared by the chunk maps

    @classmethod
    def open(cls, path: Path) -> ArchiveFile:
        path = Path(path)
        try:
            f = _open_h5(path)
        except DataError:
            raise
        except Exception as e:
            raise DataError(f"archive {path}: cannot open: {_why(e)}") from None
        try:
            return cls._from_h5(path, f)
        except Exception as e:
            f.close()
            if isinstance(e, DataError):
                raise
            raise DataError(f"archive {path}: {_why(e)}") from None

    @classmethod
    def _from_h5(cls, path: Path, f: h5py.File) -> ArchiveFile:
        attrs = f.attrs
        if _text(attrs.get("format")) != FORMAT:
            raise DataError(
                f"archive {path}: not a navrl archive (no format = {FORMAT!r} attribute)"
            )
        version = attrs.get("version")
        version = version.item() if isinstance(version, np.generic) else version
        if version not in READ_VERSIONS:
            raise DataError(
                f"archive {path}: unsupported version {version!r} "
                f"(reads {', '.join(map(str, READ_VERSIONS))})"
            )
        if _text(attrs.get("codec")) != CODEC:
            raise DataError(f"archive {path}: unsupported codec {_text(attrs.get('codec'))!r}")
        mode, level = _text(attrs.get("mode")), int(attrs.get("level", -1))
        try:
            schema = Schema.from_json(_text(attrs.get("keys")), mode, level, int(version))  # type: ignore[arg-type]
        except (ValueError, TypeError, KeyError) as e:
            raise DataError(f"archive {path}: bad keys attribute: {e}") from None
        blobs = []
        for name in schema.blob_datasets:
            ds = f.get(name)
            if not isinstance(ds, h5py.Dataset) or ds.dtype != np.uint8 or ds.ndim != 1:
                raise DataError(f"archive {path}: blob dataset /{name} missing or not uint8")
            # Read by ranges, never whole; a writer killed mid-append leaves parts unwritten.
            check_claimed_size(ds, f"archive {path}: blob dataset /{name}", unwritten=None)
            blobs.append(ds)
        rows: dict[str, np.ndarray] = {}
        for name in (*ROW_FIELDS, *KEY_FIELDS, ROW_CHECKSUM):
            ds = f.get(f"index/{name}")
            if ds is None and name == ROW_CHECKSUM:
                continue  # written before index checksums
            if not isinstance(ds, h5py.Dataset):
                raise DataError(f"archive {path}: index dataset {name} missing")
            # Read whole; unwritten chunks allowed: a kill -9 mid-append leaves some.
            check_claimed_size(ds, f"archive {path}: index/{name}", unwritten=None)
            rows[name] = ds[()]
        full = rows
        written = min(len(a) for a in rows.values())
        rows = {k: v[:written] for k, v in rows.items()}
        uncommitted = np.flatnonzero(rows["length"] < 0)  # a kill -9 between the flushes
        committed = int(uncommitted[0]) if len(uncommitted) else written
        k = len(blobs)
        for name in KEY_FIELDS:
            if rows[name].shape[1:] != (k,):
                raise DataError(
                    f"archive {path}: index/{name} has {rows[name].shape[1:]} columns, "
                    f"{k} blob datasets"
                )
        # A row counts only if every blob it names is there (SWMR writes blobs first).
        ends = rows["offset"] + rows["stored_bytes"]
        extents = np.array([ds.shape[0] for ds in blobs], dtype=np.uint64)
        whole = (ends <= extents).all(axis=1)[:committed]
        segments = int(np.argmin(whole)) if not whole.all() else committed
        complete = bool(attrs.get("complete", False))
        if complete and (segments < written or len({len(a) for a in full.values()}) > 1):
            raise DataError(
                f"archive {path}: marked complete but only {segments} of "
                f"{max(len(a) for a in full.values())} index rows name whole segments"
            )
        rows = {name: v[:segments] for name, v in rows.items()}
        # A row that fails its checksum names nothing trustworthy (not even its iteration):
        # it is left out, the rows around it kept; `verify` reports it (`index_damage`).
        bad = np.zeros(segments, dtype=bool)
        if ROW_CHECKSUM in rows and segments:
            bad = row_checksums(rows) != rows[ROW_CHECKSUM]
        untrusted = {name: v[bad] for name, v in rows.items()}
        rows = {name: v[~bad] for name, v in rows.items()}
        fd = os.open(path, os.O_RDONLY)
        try:
            # Held while open, so rotation never deletes the file (archive_retention.py); if
            # someone holds it exclusively (rotation at that instant, an outside writer), read.
            with contextlib.suppress(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            chunks = ChunkMap.for_datasets(fd, blobs)
        except BaseException:
            os.close(fd)
            raise
        return cls(
            path,
            schema,
            complete,
            float(attrs.get("created", 0.0)),
            rows,
            torn=written - segments,
            bad_rows=np.flatnonzero(bad).tolist(),
            _untrusted=untrusted,
            _file=f,
            _blobs=blobs,
            _chunks=chunks,
            _fd=fd,
        )

    @property
    def segments(self) -> int:
        return len(self.rows["length"])

    @property
    def frames(self) -> int:
        return int(self.rows["length"].sum())

    def read_blobs(self, segment: int) -> list[bytes]:
        """The stored bytes of every key of one segment, checked against the index CRC.

        Thread-safe: blobs are read with `os.pread` at their chunks' file offsets (no HDF5
        call, so no h5py lock), falling back to h5py for a dataset not laid out that way."""
        if self._file is None:
            raise ValueError(f"archive {self.path} is closed")
        out = []
        starts = self.rows["offset"][segment].tolist()
        sizes = self.rows["stored_bytes"][segment].tolist()
        crcs = self.rows["crc32"][segment].tolist()
        for j, (ds, chunks) in enumerate(zip(self._blobs, self._chunks, strict=True)):
            start, stop = starts[j], starts[j] + sizes[j]
            try:
                blob = chunks.read(start, stop) if chunks else ds[start:stop].tobytes()
            except Exception as e:
                raise DataError(
                    f"archive {self.path}: segment {segment} {self.schema.blob_label(j)}: "
                    f"cannot read: {_why(e)}"
                ) from None
            if zlib.crc32(blob) != crcs[j]:
                raise DataError(
                    f"archive {self.path}: segment {segment} {self.schema.blob_label(j)}: "
                    "checksum mismatch"
                )
            out.append(blob)
        return out

    def decode(self, segment: int, blobs: Sequence[bytes]) -> DecodedSegment:
        """Decode `read_blobs(segment)`: `[T, *step_shape]` arrays by key (thread-safe)."""
        return decode_blobs(
            self.schema, blobs, int(self.rows["length"][segment]), self.path, segment
        )

    def segment(self, segment: int) -> DecodedSegment:
        return self.decode(segment, self.read_blobs(segment))

    @property
    def index_checked(self) -> bool:
        """Whether the index has row checksums (files written before them have none)."""
        return ROW_CHECKSUM in self.rows

    def index_damage(self) -> DataError | None:
        """The index rows left out at open because they fail their row checksum, as the
        error `verify` raises (None when every row passed, or the file has no checksums)."""
        if not self.bad_rows:
            return None
        iteration, env = (int(self._untrusted[name][0]) for name in ("iteration", "env"))
        return DataError(
            f"archive {self.path}: index row {self.bad_rows[0]} (iteration {iteration}, "
            f"env {env}): checksum mismatch: the index was changed after it was written "
            f"({len(self.bad_rows)} bad row(s))"
        )

    def verify(self) -> None:
        """Check every index row against its checksum (where the file has them), then
        decode every whole segment (blob checksums, sizes, shapes); DataError on the first
        bad one."""
        if (damage := self.index_damage()) is not None:
            raise damage
        for s in range(self.segments):
            self.segment(s)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._chunks = []
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> ArchiveFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ChunkMap:
    """Where the chunks of one unfiltered 1-D uint8 dataset lie in the file, for `pread`.

    Byte b of the dataset is at `offsets[b // chunk] + b % chunk`. A wrong map cannot
    give wrong data unnoticed: every blob is checked against its CRC after the read."""

    def __init__(self, fd: int, chunk: int, offsets: np.ndarray) -> None:
        self.fd = fd
        self.chunk = chunk
        self.offsets = offsets
        self.offsets_list: list[int] = offsets.tolist()

    @classmethod
    def for_datasets(cls, fd: int, datasets: Sequence[h5py.Dataset]) -> list[ChunkMap | None]:
        return [cls._of(fd, ds) for ds in datasets]

    @classmethod
    def _of(cls, fd: int, ds: h5py.Dataset) -> ChunkMap | None:
        if ds.chunks is None or ds.compression is not None or ds.shape[0] == 0:
            return None
        chunk = ds.chunks[0]
        offsets = np.full(-(-ds.shape[0] // chunk), -1, dtype=np.int64)

        def found(info: Any) -> None:
            i = info.chunk_offset[0] // chunk
            if info.filter_mask == 0 and info.size == chunk and i < len(offsets):
                offsets[i] = info.byte_offset

        try:
            ds.id.chunk_iter(found)
        except Exception:  # an HDF5 build without chunk iteration: read through h5py
            return None
        return cls(fd, chunk, offsets) if (offsets >= 0).all() else None

    def read(self, start: int, stop: int) -> bytes:
        i, within = divmod(start, self.chunk)
        if within + stop - start <= self.chunk:  # the usual case: one chunk, one pread
            part = os.pread(self.fd, stop - start, self.offsets_list[i] + within)
            if len(part) != stop - start:
                raise DataError(f"short read: {len(part)} of {stop - start} bytes (truncated?)")
            return part
        parts = []
        while start < stop:
            i, within = divmod(start, self.chunk)
            n = min(stop - start, self.chunk - within)
            part = os.pread(self.fd, n, int(self.offsets[i]) + within)
            if len(part) != n:
                raise DataError(f"short read: {len(part)} of {n} bytes (file truncated?)")
            parts.append(part)
            start += n
        return b"".join(parts)


def row_checksums(rows: Mapping[str, Any]) -> np.ndarray:
    """CRC-32 of each index row: every ROW_FIELDS and KEY_FIELDS value of the row as
    little-endian bytes, in that order (the `length` the row commits with included)."""
    fields = (*ROW_FIELDS.items(), *KEY_FIELDS.items())
    n = len(rows["iteration"])
    if n == 0:
        return np.zeros(0, dtype=np.uint32)
    parts = [
        np.asarray(rows[name], dtype=np.dtype(dtype).newbyteorder("<")).reshape(n, -1)
        for name, dtype in fields
    ]
    packed = np.concatenate([np.ascontiguousarray(p).view(np.uint8) for p in parts], axis=1)
    return np.fromiter((zlib.crc32(row) for row in packed), dtype=np.uint32, count=n)


def decode_blobs(
    schema: Schema, blobs: Sequence[bytes], length: int, path: Path | str, segment: int
) -> DecodedSegment:
    """`schema.decode`, a bad blob reported as DataError naming file and segment."""
    try:
        return schema.decode(blobs, length)
    except CodecError as e:
        raise DataError(f"archive {path}: segment {segment}: {e}") from None


def _open_h5(path: Path) -> h5py.File:
    if not path.exists():
        raise DataError(f"archive {path}: not found")
    if path.stat().st_size == 0:
        raise DataError(f"archive {path}: empty file")
    if not h5py.is_hdf5(path):
        raise DataError(f"archive {path}: not an HDF5 file (or its superblock is damaged)")
    try:
        return open_confined(path, "archive")
    except OSError as e:
        if "already open for write" not in str(e):
            raise  # truncated or damaged: HDF5 checks the end of file against the superblock
    # A writer killed mid-run left the file flagged open for (SWMR) writing. Only SWMR read
    # opens it; not the first choice, because SWMR read retries a failed read with sleeps.
    return open_confined(path, "archive", libver="latest", swmr=True)


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def _why(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}" if not isinstance(e, DataError) else str(e)
