"""RolloutArchiver: every `archive.interval`-th rollout, compressed into HDF5 archive files.

For each rollout lease it receives, a due one (`iteration % interval == 0`) is copied to
host memory and its lease released at once; the copy is split into one segment per env,
compressed in a thread pool of `archive.workers` (tasks of several envs each, so each
is worth a thread) and appended to `DIR/rollouts-<seq:06d>.h5` (storage/archive.py has
the format). A file past `archive.max_file_bytes` is closed and the next started; past
`archive.max_total_bytes` in the directory, the oldest files are removed. `flush`
closes the open file, which marks it complete; after a kill -9 the file being written
reads back up to its last whole segment. A write that fails (disk full, I/O error) turns
archiving off until the daemon restarts (HDF5 cannot be trusted after one: see
`_abandon_file`); it is logged, every rollout not archived counts as a drop, and training
goes on. The producer sends only due rollouts here;
a lease that is not due is released untouched.
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
    on_written=metrics.archive_written,
)
```
Only build it when `cfg.archive.interval > 0`.
"""

from __future__ import annotations

import math
import os
import resource
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anyio
import anyio.to_thread
import numpy as np
import structlog
import torch
from tensordict import TensorDictBase

from navrl_daemon.config import ArchiveConfig
from navrl_daemon.runtime.channels import Channel, Overflow, Receiver
from navrl_daemon.runtime.leases import Lease
from navrl_daemon.runtime.supervisor import Shutdown
from navrl_daemon.storage.archive import (
    ArchiveWriter,
    Schema,
    archive_files,
    archive_name,
    encode_segments,
    next_sequence,
)
from navrl_daemon.storage.codec import parse_key_filters
from navrl_daemon.storage.episode_store import Arrays, rollout_arrays

log = structlog.get_logger("archiver")

# Raw bytes per compression task: below this the thread hand-off costs more than it saves.
MIN_TASK_BYTES = 1 << 20
# Free disk space the archive leaves alone, so checkpoints can still be written.
FREE_RESERVE = 512 << 20


def arrays_bytes(buffer: TensorDictBase) -> int:
    return sum(t.numel() * t.element_size() for t in buffer.values(True, True))


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


class RolloutArchiver:
    name = "archiver"

    def __init__(
        self,
        cfg: ArchiveConfig,
        directory: Path,
        rollouts: Receiver[Lease],
        *,
        shutdown: Shutdown,
        on_written: Callable[[int, int, int], None] = lambda raw, stored, segments: None,
        on_failed: Callable[[], None] = lambda: None,
    ) -> None:
        self.cfg = cfg
        self.directory = directory
        self.rollouts = rollouts
        self.shutdown = shutdown
        self.on_written = on_written
        self.on_failed = on_failed
        self.archived = 0
        self.failures = 0
        self._key_filters = parse_key_filters(cfg.key_filters)
        self._pool = ThreadPoolExecutor(cfg.workers, thread_name_prefix="archive-encode")
        self._files = anyio.CapacityLimiter(1)  # one thread at a time touches the HDF5 file
        self._schema: Schema | None = None
        self._writer: ArchiveWriter | None = None
        self._next_seq = next_sequence(directory)  # a restart never appends to an old file
        self._host: TensorDictBase | None = None  # pinned staging buffer for CUDA rollouts
        self._broken: list[ArchiveWriter] = []  # see _abandon_file

    async def run(self) -> None:
        try:
            async for lease in self.rollouts:
                with lease:
                    iteration = int(lease.meta["iteration"])
                    if not is_due(self.cfg, iteration) or self.shutdown.abort.is_set():
                        continue
                    if self._broken:
                        self.on_failed()  # archiving is off since a write failed
                        continue
                    room = self._room_for(arrays_bytes(lease.buffer))
                    if room is not None:
                        self.on_failed()
                        log.warning("rollout not archived: no room for it", reason=room)
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
        if self._writer is None:
            path = self.directory / archive_name(self._next_seq)
            self._next_seq += 1
            self._writer = ArchiveWriter(path, self._schema)
            log.info("archive file started", path=str(path))
        stored = self._writer.append(segments)
        raw = sum(s.raw_bytes for s in segments)
        if self._writer.file_bytes >= self.cfg.max_file_bytes:
            self._close_file()
        self._enforce_total()
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

    def _room_for(self, nbytes: int) -> str | None:
        """Why `nbytes` more (raw, an upper bound of what LZ4 stores) would not fit, or None.

        Checked before writing because a failed HDF5 write cannot be undone (`_abandon_file`)
        and the checkpoints need the disk more: the archive stops `FREE_RESERVE` early."""
        self.directory.mkdir(parents=True, exist_ok=True)
        st = os.statvfs(self.directory)
        free = st.f_bavail * st.f_frsize
        if free < 2 * nbytes + FREE_RESERVE:
            return f"{free} bytes free on the archive's disk, keeping {FREE_RESERVE} spare"
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        size = self._writer.file_bytes if self._writer is not None else 0
        if limit != resource.RLIM_INFINITY and size + 2 * nbytes + (1 << 20) > limit:
            return f"the process file size limit (RLIMIT_FSIZE) is {limit} bytes"
        return None

    def _abandon_file(self) -> None:
        """After a failed write, HDF5's state for that file cannot be trusted: closing it or
        even opening another file in this process crashed it (measured: segfault). So the
        file is left open and untouched (a reader sees it as incomplete, readable up to its
        last whole segment) and archiving stays off until the daemon restarts."""
        if self._writer is not None:
            self._broken.append(self._writer)  # never closed, never collected
        self._writer = None

    def _enforce_total(self) -> None:
        """Remove the oldest files while the directory holds more than max_total_bytes."""
        files = archive_files(self.directory)
        sizes = {p: p.stat().st_size for p in files}
        total = sum(sizes.values())
        current = self._writer.path if self._writer is not None else None
        for path in files:
            if total <= self.cfg.max_total_bytes or path == current:
                break
            path.unlink(missing_ok=True)
            total -= sizes[path]
            log.info("archive file removed (max_total_bytes)", path=str(path))

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
