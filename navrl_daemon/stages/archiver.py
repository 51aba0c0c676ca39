"""RolloutArchiver: every `archive.interval`-th rollout, compressed into HDF5 archive files.

For each rollout lease it receives, a due one (`iteration % interval == 0`) is copied to
host memory and its lease released at once; the copy is split into one segment per env,
compressed in a thread pool of `archive.workers` (tasks of several envs each, so each
is worth a thread) and appended to `DIR/rollouts-<seq:06d>.h5` (storage/archive.py has
the format). A file past `archive.max_file_bytes` is closed and the next started.
Before each append, storage/archive_retention.py checks that the rollout fits under
`archive.max_total_bytes` with `FREE_RESERVE` left on the disk: with `archive.on_full =
"rotate"` it deletes the oldest finished files no reader holds to make room; with "drop"
or "block" nothing is deleted and a rollout that does not fit is skipped (counted as a
drop; the log says so once when the archive fills and once when it has room again).
`flush` closes the open file, which marks it complete; after a kill -9 the file being
written reads back up to its last whole segment. A run resumed from a checkpoint redoes
the iterations a crash lost after it, and one killed before its first checkpoint starts
over from rollout 0; those that were archived before the crash are not archived again
(each iteration is in the archive once; an index row that fails its checksum counts for
nothing, and is logged). A write that fails (disk full,
I/O error) turns archiving off until the daemon restarts (HDF5 cannot be trusted after
one: see `_abandon_file`); it is logged, every rollout not archived counts as a drop, and
training goes on. The producer sends only due rollouts here; a lease that is not due is
released untouched.
While draining (first signal) it still archives what is queued; once `shutdown.abort` is
set (second signal) it releases leases without archiving them.

Wiring (pipeline/daemon.py):

```
archive = archive_channel(cfg.archive, on_dropped=metrics.archive_dropped)
# the producer's outputs gain archive.sender(); its lease is shared to one more consumer
RolloutArchiver(
    cfg.archive,
    state_dir / "archive",
    archive.receiver(),
    shutdown=shutdown,
    events=ArchiverEvents(
        on_written=metrics.archive_written,
        on_failed=metrics.archive_dropped,
        on_rotated=metrics.archive_rotated,
        on_usage=metrics.archive_usage,
    ),
)
```
Only build it when `cfg.archive.interval > 0`.
"""

from __future__ import annotations

import math
import resource
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.to_thread
import numpy as np
import structlog
import torch
from tensordict import TensorDictBase

from navrl_daemon.config import ArchiveConfig
from navrl_daemon.errors import DataError
from navrl_daemon.runtime.channels import Channel, Overflow, Receiver
from navrl_daemon.runtime.leases import Lease
from navrl_daemon.runtime.supervisor import Shutdown
from navrl_daemon.storage.archive import (
    ArchiveWriter,
    Schema,
    archive_name,
    encode_segments,
    last_archived_iteration,
    next_sequence,
    remove_temp_files,
)
from navrl_daemon.storage.archive_retention import ArchiveRetention, ArchiveUsage, Rotated
from navrl_daemon.storage.codec import parse_key_filters
from navrl_daemon.storage.episode_store import Arrays, rollout_arrays

log = structlog.get_logger("archiver")

# Raw bytes per compression task: below this the thread hand-off costs more than it saves.
MIN_TASK_BYTES = 1 << 20
# Free disk space the archive leaves alone, so checkpoints can still be written.
FREE_RESERVE = 512 << 20
# What an append adds to a file beyond its blobs' bytes: index rows and the last chunk's
# unused tail (storage/archive.py: MAX_BLOB_CHUNK).
APPEND_SLACK = 256 << 10


def arrays_bytes(buffer: TensorDictBase) -> int:
    return sum(t.numel() * t.element_size() for t in buffer.values(True, True))


def _log_damage(error: DataError) -> None:
    log.warning(
        "archive damaged: what it names is not counted as archived; `archive verify` lists it",
        error=str(error),
    )


def archive_channel(cfg: ArchiveConfig, on_dropped: Callable[[int], None]) -> Channel[Lease]:
    """The producer → archiver channel: `on_full` picks block or drop; a dropped lease is
    released, and counted through `on_dropped` when it was due for archiving."""

    def drop(lease: Lease) -> None:
        due = is_due(cfg, lease.meta.get("iteration", 0))
        lease.release()
        if due:
            on_dropped(1)

    overflow = Overflow.BLOCK if cfg.on_full == "block" else Overflow.DROP_NEWEST
    return Channel("archive", cfg.queue_size, overflow, on_drop=drop)


def is_due(cfg: ArchiveConfig, iteration: int) -> bool:
    return cfg.interval > 0 and iteration % cfg.interval == 0


@dataclass(frozen=True)
class ArchiverEvents:
    """What the archiver reports as it goes (Prometheus)."""

    on_written: Callable[[int, int, int], None] = lambda raw, stored, segments: None
    on_failed: Callable[[], None] = lambda: None  # a rollout due for archiving, not archived
    on_rotated: Callable[[int, int], None] = lambda files, nbytes: None
    on_usage: Callable[[ArchiveUsage], None] = lambda usage: None


class RolloutArchiver:
    name = "archiver"

    def __init__(
        self,
        cfg: ArchiveConfig,
        directory: Path,
        rollouts: Receiver[Lease],
        *,
        shutdown: Shutdown,
        resumed_from: int = 0,
        events: ArchiverEvents | None = None,
    ) -> None:
        events = events or ArchiverEvents()
        self.cfg = cfg
        self.directory = directory
        self.rollouts = rollouts
        self.shutdown = shutdown
        self.on_written = events.on_written
        self.on_failed = events.on_failed
        self.on_rotated = events.on_rotated
        self.on_usage = events.on_usage
        self.retention = ArchiveRetention(
            directory,
            max_total_bytes=cfg.max_total_bytes,
            reserve_bytes=FREE_RESERVE,
            rotate=cfg.on_full == "rotate",
        )
        self._full = False  # no room for the last rollout (logged when it changes)
        self.archived = 0
        self.failures = 0
        self._key_filters = parse_key_filters(cfg.key_filters)
        self._pool = ThreadPoolExecutor(cfg.workers, thread_name_prefix="archive-encode")
        self._files = anyio.CapacityLimiter(1)  # one thread at a time touches the HDF5 file
        self._schema: Schema | None = None
        self._writer: ArchiveWriter | None = None
        removed = remove_temp_files(directory)
        if removed:
            log.warning("removed half-created archive files", files=[p.name for p in removed])
        self._next_seq = next_sequence(directory)  # a restart never appends to an old file
        # Iterations after checkpoint `resumed_from` up to this one were archived before a
        # crash, and are about to be redone; so are those of a run killed before its first
        # checkpoint, which starts over from rollout 0 (resumed_from = 0).
        archived = last_archived_iteration(directory, on_bad=_log_damage)
        self._archived_through = archived if archived is not None else -1  # rollouts from 0
        if archived is not None and archived >= resumed_from:
            log.info(
                "archive holds rollouts from before the restart: not archived again",
                resumed_from=resumed_from,
                archived_through=archived,
            )
        self._host: TensorDictBase | None = None  # pinned staging buffer for CUDA rollouts
        self._broken: list[ArchiveWriter] = []  # see _abandon_file

    async def run(self) -> None:
        try:
            self.on_usage(await anyio.to_thread.run_sync(self.retention.usage))
            async for lease in self.rollouts:
                with lease:
                    iteration = int(lease.meta["iteration"])
                    if not is_due(self.cfg, iteration) or self.shutdown.abort.is_set():
                        continue
                    if iteration <= self._archived_through:
                        log.info("rollout already archived before the restart", iteration=iteration)
                        continue
                    if self._broken:
                        self.on_failed()  # archiving is off since a write failed
                        continue
                    if limit := _file_size_limit(self._writer, arrays_bytes(lease.buffer)):
                        self.on_failed()
                        log.warning("rollout not archived", reason=limit)
                        continue
                    policy_version = int(lease.meta["policy_version"])
                    arrays = await anyio.to_thread.run_sync(self._host_copy, lease.buffer)
                # The lease is back: the producer may refill it while we compress.
                try:
                    raw, stored, segments = await anyio.to_thread.run_sync(
                        self._archive, arrays, iteration, policy_version, limiter=self._files
                    )
                # Disk full, I/O error, permissions (h5py raises RuntimeError for HDF5's write
                # errors): training goes on without this rollout.
                except (OSError, RuntimeError) as err:
                    self._abandon_file()
                    self.failures += 1
                    self.on_failed()
                    log.error(
                        "archive write failed: ARCHIVING OFF until restart, training goes on",
                        iteration=iteration,
                        error=f"{type(err).__name__}: {err}",
                        failures=self.failures,
                    )
                    continue
                if segments == 0:  # no room for it (the archive is full)
                    self.on_failed()
                    continue
                self.archived += 1
                self.on_written(raw, stored, segments)
        finally:
            self.rollouts.close()

    def _host_copy(self, buffer: TensorDictBase) -> Arrays:
        """The rollout's arrays in host memory that this stage owns."""
        devices = {t.device for t in buffer.values(include_nested=True, leaves_only=True)}
        if all(d.type == "cpu" for d in devices):
            # numpy copies, so this thread never starts a second OpenMP team (compute.py).
            return rollout_arrays(buffer, copy=True)
        if self._host is None:
            self._host = buffer.apply(
                lambda t: torch.empty(t.shape, dtype=t.dtype, pin_memory=True), device="cpu"
            )
        self._host.copy_(buffer, non_blocking=True)
        for device in devices - {torch.device("cpu")}:  # copies queued on its current stream
            torch.cuda.synchronize(device)
        # Compression finishes before the next copy into the staging buffer (one at a time).
        return rollout_arrays(self._host, copy=False)

    def _archive(self, arrays: Arrays, iteration: int, policy_version: int) -> tuple[int, int, int]:
        t0 = time.perf_counter()
        if self._schema is None:
            self._schema = Schema.for_rollout(
                arrays,
                mode=self.cfg.mode,
                level=self.cfg.level,
                default_filter=self.cfg.filter,
                key_filters=self._key_filters,
                version=self.cfg.format,
            )
        num_envs = next(iter(arrays.values())).shape[0]
        raw_total = sum(a.nbytes for a in arrays.values())
        tasks = max(1, min(num_envs, 4 * self.cfg.workers, math.ceil(raw_total / MIN_TASK_BYTES)))
        groups = np.array_split(np.arange(num_envs), tasks)
        encoded = self._pool.map(
            lambda envs: encode_segments(
                self._schema,  # type: ignore[arg-type]
                arrays,
                envs.tolist(),
                iteration=iteration,
                policy_version=policy_version,
            ),
            groups,
        )
        segments = [s for part in encoded for s in part]
        if not self._make_room(sum(s.stored_bytes for s in segments) + APPEND_SLACK):
            return 0, 0, 0
        if self._writer is None:
            path = self.directory / archive_name(self._next_seq)
            self._next_seq += 1
            self._writer = ArchiveWriter(path, self._schema)
            log.info("archive file started", path=str(path))
        stored = self._writer.append(segments)
        raw = sum(s.raw_bytes for s in segments)
        if self._writer.file_bytes >= self.cfg.max_file_bytes:
            self._close_file()
        self.on_usage(self.retention.usage())
        log.debug(
            "rollout archived",
            iteration=iteration,
            segments=len(segments),
            raw_bytes=raw,
            stored_bytes=stored,
            seconds=round(time.perf_counter() - t0, 4),
        )
        return raw, stored, len(segments)

    def _close_file(self) -> None:
        if self._writer is not None:
            writer, self._writer = self._writer, None
            writer.close()
            log.info(
                "archive file closed",
                path=str(writer.path),
                segments=writer.segments,
                raw_bytes=writer.raw_bytes,
                stored_bytes=writer.stored_bytes,
            )

    def _make_room(self, need: int) -> bool:
        """Whether `need` bytes fit (storage/archive_retention.py), after rotating old
        files out if `on_full = "rotate"`. Checked before writing because a failed HDF5
        write cannot be undone (`_abandon_file`) and the checkpoints need the disk more."""
        writing = self._writer.path if self._writer is not None else None
        why, rotated = self.retention.make_room(need, need, writing)
        if why is not None and self.retention.rotate and self.retention.usage().files == 1:
            self._close_file()  # the file being written is the only one: finish it, let it go
            why, more = self.retention.make_room(need, need, None)
            rotated = Rotated(rotated.files + more.files, rotated.bytes + more.bytes)
        if rotated.files:
            self.on_rotated(len(rotated.files), rotated.bytes)
            self.on_usage(self.retention.usage())
            log.info("archive files rotated out", files=list(rotated.files), bytes=rotated.bytes)
        full = why is not None
        if full != self._full:  # said once when the archive fills, once when it has room
            if full:
                log.warning("archive full: rollouts are not archived until it has room", reason=why)
            else:
                log.info("archive has room again")
            self._full = full
        return not full

    def _abandon_file(self) -> None:
        """After a failed write, HDF5's state for that file cannot be trusted: closing it or
        even opening another file in this process crashed it (measured: segfault). So the
        file is left open and untouched (a reader sees it as incomplete, readable up to its
        last whole segment) and archiving stays off until the daemon restarts."""
        if self._writer is not None:
            self._broken.append(self._writer)  # never closed, never collected
        self._writer = None

    async def flush(self, deadline: float) -> None:
        """Close the open file (marking it complete) once any append in flight is done."""
        if self._broken:
            self._pool.shutdown(wait=True)
            return
        try:
            await anyio.to_thread.run_sync(self._close_file, limiter=self._files)
        except (OSError, RuntimeError) as err:
            log.error("closing the archive file failed: it stays incomplete", error=str(err))
        self._pool.shutdown(wait=True)


def _file_size_limit(writer: ArchiveWriter | None, nbytes: int) -> str | None:
    """Why `nbytes` more (raw, an upper bound of what LZ4 stores) would pass the process's
    file size limit (RLIMIT_FSIZE: the write would fail with SIGXFSZ/EFBIG), or None."""
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    size = writer.file_bytes if writer is not None else 0
    if limit != resource.RLIM_INFINITY and size + 2 * nbytes + (1 << 20) > limit:
        return f"the process file size limit (RLIMIT_FSIZE) is {limit} bytes"
    return None
