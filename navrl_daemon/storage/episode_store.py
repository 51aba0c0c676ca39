"""Sampling rollouts back from compressed segments: `ArchiveReader` and `EpisodeStore`.

Both hold compressed segments (one env's T steps of one rollout), index them with a
`SegmentIndex` and sample the same way:

- `sample(batch, rng)`: uniform transitions, a TensorDict `[batch]`;
- `windows(batch, width, rng)`: uniform `width`-step windows inside one segment, `[batch, width]`.

Only the segments a batch needs are decoded, in a thread pool (LZ4 releases the GIL),
in tasks of several segments each so each is big enough to be worth a thread; decoded
segments (storage/segment.py: one buffer each) stay in a byte-bounded LRU cache. A batch
is gathered as whole step rows, one fancy index per sample, then split into keys once.
`ArchiveReader` reads one or many archive files; its blob reads are `os.pread`s
(archive.ChunkMap), so they run in the pool too, outside h5py's global lock.
`EpisodeStore` keeps segments in memory under a byte budget, oldest evicted first: an
off-policy replay buffer.

Not thread-safe: use each from one thread at a time.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from navrl_daemon.errors import DataError
from navrl_daemon.storage.archive import (
    FORMAT_VERSION,
    ArchiveFile,
    EncodedSegment,
    Schema,
    decode_blobs,
    encode_segments,
)
from navrl_daemon.storage.codec import Filter, Mode
from navrl_daemon.storage.decode_pool import DecodePool
from navrl_daemon.storage.segment import DecodedSegment
from navrl_daemon.storage.segment_index import SegmentIndex

Arrays = dict[str, np.ndarray]


def rollout_arrays(rollout: TensorDictBase, *, copy: bool) -> Arrays:
    """`a/b/c` path → numpy array of every leaf of a CPU TensorDict (copied if `copy`)."""
    out = {}
    for key, value in rollout.items(include_nested=True, leaves_only=True):
        path = "/".join((key,) if isinstance(key, str) else key)
        array = value.detach().numpy()
        out[path] = array.copy() if copy else array
    return out


def as_tensordict(
    schema: Schema, arrays: Mapping[str, np.ndarray], batch: Sequence[int]
) -> TensorDict:
    td = TensorDict({}, batch_size=list(batch))
    for spec in schema.keys:
        td.set(spec.key, torch.from_numpy(arrays[spec.path]))
    return td


class DecodedCache:
    """Decoded segments by id, least recently used evicted first past `max_bytes`."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._items: OrderedDict[int, DecodedSegment] = OrderedDict()

    def get(self, key: int) -> DecodedSegment | None:
        item = self._items.get(key)
        if item is None:
            self.misses += 1
            return None
        self.hits += 1
        self._items.move_to_end(key)
        return item

    def put(self, key: int, item: DecodedSegment) -> None:
        if item.nbytes > self.max_bytes or key in self._items:
            return
        self._items[key] = item
        self.bytes += item.nbytes
        while self.bytes > self.max_bytes:
            _, old = self._items.popitem(last=False)
            self.bytes -= old.nbytes

    def __len__(self) -> int:
        return len(self._items)


class _SegmentSampler:
    """Index, sampling, parallel decode and cache; subclasses say where the blobs are."""

    schema: Schema
    index: SegmentIndex
    ids: np.ndarray  # stable id of each indexed segment (cache key)

    def __init__(self, *, workers: int, cache_bytes: int) -> None:
        self.workers = workers
        self.cache = DecodedCache(cache_bytes)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="archive-decode")
        self._processes: DecodePool | None = None  # ArchiveReader(processes=True)

    # what subclasses provide

    def _read(self, position: int) -> DecodedSegment:
        """Read and decode the segment at this index position (called from the pool's
        threads); DataError names what is bad."""
        raise NotImplementedError

    def _job(self, position: int) -> tuple[int, int, int]:
        """(file, segment in it, length) of a position, for worker processes."""
        raise NotImplementedError

    # sampling

    @property
    def segments(self) -> int:
        return self.index.segments

    @property
    def frames(self) -> int:
        return self.index.frames

    def sample(self, batch: int, rng: np.random.Generator) -> TensorDict:
        """`batch` transitions drawn uniformly (with replacement) over all frames."""
        if self.frames == 0:
            raise ValueError("nothing to sample: no frames")
        return self.gather(rng.integers(0, self.frames, size=batch))

    def gather(self, frames: np.ndarray) -> TensorDict:
        """The transitions at these global frame numbers, a TensorDict `[len(frames)]`."""
        positions, steps = self.index.locate(frames)
        decoded = self.decode_positions(positions)
        rows = np.empty((len(positions), self.schema.layout.step_bytes), dtype=np.uint8)
        for i, (p, t) in enumerate(zip(positions.tolist(), steps.tolist(), strict=True)):
            rows[i] = decoded[p].rows(t)
        return as_tensordict(self.schema, self.schema.layout.split(rows), [len(positions)])

    def windows(self, batch: int, width: int, rng: np.random.Generator) -> TensorDict:
        """`batch` windows of `width` consecutive steps of one segment, `[batch, width]`."""
        starts = self.index.windows(width)
        if starts.frames == 0:
            raise ValueError(f"no segment has {width} steps")
        positions, first = starts.locate(rng.integers(0, starts.frames, size=batch))
        decoded = self.decode_positions(positions)
        rows = np.empty((batch, width, self.schema.layout.step_bytes), dtype=np.uint8)
        for i, (p, t) in enumerate(zip(positions.tolist(), first.tolist(), strict=True)):
            rows[i] = decoded[p].rows(slice(t, t + width))
        return as_tensordict(self.schema, self.schema.layout.split(rows), [batch, width])

    def segment(self, position: int) -> TensorDict:
        """One whole segment as a TensorDict `[T]` (its own copy)."""
        decoded = self.decode_positions(np.array([position]))[position]
        arrays = {path: array.copy() for path, array in decoded.items()}
        return as_tensordict(self.schema, arrays, [int(self.index.lengths[position])])

    def decode_positions(self, positions: np.ndarray) -> dict[int, DecodedSegment]:
        """Decoded arrays of each distinct position: cached, or read and decoded in the pool
        (with worker processes: views of their arena, valid until the next call)."""
        found: dict[int, DecodedSegment] = {}
        missing: list[int] = []
        for p in np.unique(positions).tolist():
            hit = self.cache.get(int(self.ids[p]))
            if hit is not None:
                found[p] = hit
            else:
                missing.append(p)
        if missing and self._processes is not None:
            decoded = self._processes.decode([self._job(p) for p in missing], self.schema.layout)
            for p, segment in zip(missing, decoded, strict=True):
                found[p] = segment
                if segment.nbytes <= self.cache.max_bytes:  # the arena is reused: a copy
                    self.cache.put(
                        int(self.ids[p]),
                        DecodedSegment(segment.raw.copy(), segment.length, segment.layout),
                    )
        elif missing:
            # A few tasks per worker, each of several segments: big enough to beat the
            # hand-off cost, enough of them to balance.
            tasks = np.array_split(np.array(missing), min(len(missing), 2 * self.workers))
            for task, results in zip(tasks, self._pool.map(self._decode_task, tasks), strict=True):
                for p, arrays in zip(task.tolist(), results, strict=True):
                    found[p] = arrays
                    self.cache.put(int(self.ids[p]), arrays)
        return found

    def _decode_task(self, positions: np.ndarray) -> list[DecodedSegment]:
        return [self._read(p) for p in positions.tolist()]

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        if self._processes is not None:
            self._processes.close()


class ArchiveReader(_SegmentSampler):
    """Samples from one or many archive files with the same keys.

    Opens each file and indexes its whole segments: an incomplete file is read up to its
    last whole segment. A file that is not a readable archive, or whose keys differ from
    the first file's, raises DataError naming it; with `on_bad`, it is handed the error
    and skipped instead (a long-running reader of a directory keeps going).

    `processes=True` decodes in `workers` worker processes (storage/decode_pool.py)
    instead of threads: on a small machine threads do not scale past one core for these
    short LZ4 calls (docs/archive.md), processes do. The reader must then be created
    under `if __name__ == "__main__":` in a script (the workers are spawned).
    """

    def __init__(
        self,
        paths: Sequence[Path],
        *,
        workers: int = 2,
        cache_bytes: int = 256 << 20,
        on_bad: Callable[[DataError], None] | None = None,
        processes: bool = False,
    ) -> None:
        self.files: list[ArchiveFile] = []
        try:
            for path in paths:
                try:
                    f = ArchiveFile.open(path)
                    if self.files and not f.schema.same_keys(self.files[0].schema):
                        f.close()
                        raise DataError(
                            f"archive {path}: keys, dtypes or shapes differ from "
                            f"{self.files[0].path}"
                        )
                except DataError as e:
                    if on_bad is None:
                        raise
                    on_bad(e)
                    continue
                self.files.append(f)
            if not self.files:
                raise DataError(f"no readable archive among {len(paths)} file(s)")
        except BaseException:
            for f in self.files:
                f.close()
            raise
        super().__init__(workers=1 if processes else workers, cache_bytes=cache_bytes)
        self.schema = self.files[0].schema
        self._file_of = np.concatenate(
            [np.full(f.segments, i, dtype=np.int64) for i, f in enumerate(self.files)]
        )
        self._local = np.concatenate([np.arange(f.segments, dtype=np.int64) for f in self.files])
        self.index = SegmentIndex(np.concatenate([f.rows["length"] for f in self.files]))
        self.ids = np.arange(self.index.segments)
        if processes:
            try:
                self._processes = DecodePool([f.path for f in self.files], workers)
            except BaseException:
                self.close()
                raise

    def column(self, name: str) -> np.ndarray:
        """One index column (iteration, env, policy_version, ...) over all segments."""
        return np.concatenate([f.rows[name] for f in self.files])

    def _read(self, position: int) -> DecodedSegment:
        return self.files[self._file_of[position]].segment(int(self._local[position]))

    def _job(self, position: int) -> tuple[int, int, int]:
        file, local = int(self._file_of[position]), int(self._local[position])
        return file, local, int(self.files[file].rows["length"][local])

    def close(self) -> None:
        super().close()
        for f in self.files:
            f.close()

    def __enter__(self) -> ArchiveReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EpisodeStore(_SegmentSampler):
    """Compressed rollouts in memory under `budget_bytes` (stored), oldest evicted first."""

    def __init__(
        self,
        budget_bytes: int,
        *,
        mode: Mode = "episode",
        level: int = 0,
        default_filter: Filter = "none",
        key_filters: Sequence[tuple[str, Filter]] = (),
        workers: int = 2,
        cache_bytes: int = 64 << 20,
        version: int = FORMAT_VERSION,
    ) -> None:
        super().__init__(workers=workers, cache_bytes=cache_bytes)
        self.budget_bytes = budget_bytes
        self._codec_args = dict(
            mode=mode,
            level=level,
            default_filter=default_filter,
            key_filters=key_filters,
            version=version,
        )
        self.schema = Schema(())
        self.stored_bytes = 0
        self.evicted = 0
        self._segments: list[EncodedSegment] = []
        self._reindex()

    def add(self, rollout: TensorDictBase, *, iteration: int = 0, policy_version: int = 0) -> None:
        """Compress a CPU rollout `[N, T]` (one segment per env) and append it."""
        arrays = rollout_arrays(rollout, copy=False)
        if not self.schema.keys:
            self.schema = Schema.for_rollout(arrays, **self._codec_args)  # type: ignore[arg-type]
        layout = {k.path: (k.codec.dtype, k.codec.step_shape) for k in self.schema.keys}
        if {p: (a.dtype, a.shape[2:]) for p, a in arrays.items()} != layout:
            raise ValueError("rollout keys, dtypes or shapes differ from the store's first rollout")
        groups = np.array_split(np.arange(rollout.batch_size[0]), self.workers)
        encoded = self._pool.map(
            lambda envs: encode_segments(
                self.schema,
                arrays,
                envs.tolist(),
                iteration=iteration,
                policy_version=policy_version,
            ),
            [g for g in groups if len(g)],
        )
        for part in encoded:
            for segment in part:
                self._segments.append(segment)
                self.stored_bytes += segment.stored_bytes
        drop = 0
        while self.stored_bytes > self.budget_bytes and drop < len(self._segments):
            self.stored_bytes -= self._segments[drop].stored_bytes
            drop += 1
        del self._segments[:drop]
        self.evicted += drop
        self._reindex()

    def _reindex(self) -> None:
        self.index = SegmentIndex(np.array([s.length for s in self._segments], dtype=np.int64))
        self.ids = np.arange(self.evicted, self.evicted + len(self._segments))

    def _read(self, position: int) -> DecodedSegment:
        s = self._segments[position]
        return decode_blobs(
            self.schema, s.blobs, s.length, "<episode store>", int(self.ids[position])
        )
