"""HDF5Prefetcher: batches of the multimodal datasets in `prefetch.paths`, for the offline
objectives ("bc", "ppo+bc"), over a bounded `batches` channel.

The files are checked and their low-dimensional data loaded once (offline/datasets.py);
images are read and resized by `prefetch.workers` processes into shared-memory slots
(offline/prefetch.py). Each slot is lent out under a lease from a pool of
`depth + workers + 1` slots: `depth` batches can wait in the channel, the trainer holds
one, and each worker can be reading one. A batch travels as a `Lease[int]` (the slot)
whose `meta["batch"]` is the TensorDict (`images` uint8 `[B, 3, 3, S, S]` viewing the
slot, `joint`, `action`, ...); the trainer releases the lease once it has moved the batch
to its device or used it, and only then is the slot read into again. An exhausted pool
or a full channel is backpressure: the workers wait.

`prefetch.layout = "archive"` reads the daemon's own rollout archives instead (for BC of
the navigation policy, `rl.bc.beta_bc_loss`): uniform transitions from `ArchiveReader`,
decoded in a thread pool (pread + LZ4, no h5py lock to dodge), each an owned TensorDict
under a lease from a pool of `depth + 1`.

The batch sequence is deterministic given `prefetch.seed`, and batch k is a function of
k alone (per-epoch permutations; for archives a generator seeded with (seed, k)), so a
resumed run asks for `first_batch` = the batches it has used and goes on with the ones it
had not seen. The daemon checks and loads the files at start-up and hands them in
(`data`), so bad data stops it before any stage runs. On
shutdown the stage stops at the next batch boundary, closes the channel, and stops its
workers; a killed daemon's workers notice on their own (offline/prefetch.py).

Wiring: navrl_daemon/offline/wiring.py, when `offline.objective != "none"`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable, Callable

import anyio
import anyio.to_thread
import numpy as np
import structlog

from navrl_daemon.config import OfflineConfig, PrefetchConfig
from navrl_daemon.errors import ConfigError
from navrl_daemon.offline.datasets import MultimodalDataset, expand_paths
from navrl_daemon.offline.prefetch import Prefetcher
from navrl_daemon.runtime.channels import Sender
from navrl_daemon.runtime.leases import Lease, LeasePool
from navrl_daemon.runtime.supervisor import Shutdown
from navrl_daemon.storage.episode_store import ArchiveReader

log = structlog.get_logger("prefetcher")


class HDF5Prefetcher:
    name = "prefetcher"

    def __init__(
        self,
        cfg: PrefetchConfig,
        offline: OfflineConfig,
        batches: Sender[Lease[int]],
        *,
        shutdown: Shutdown,
        on_batch: Callable[[float], None] = lambda wait_s: None,
        first_batch: int = 0,
        data: MultimodalDataset | ArchiveReader | None = None,
    ) -> None:
        """`data`: the files already checked and loaded (`load_offline_data`); None loads
        them when the stage starts. The stage closes it."""
        if not cfg.paths:
            raise ConfigError("prefetch.paths: at least one file or glob for an offline objective")
        self.cfg = cfg
        self.offline = offline
        self.batches = batches
        self.shutdown = shutdown
        self.on_batch = on_batch
        self.ready = anyio.Event()  # set once the data is loaded and the workers started
        self.action_stats: tuple[np.ndarray, np.ndarray] | None = None
        self.first_batch = first_batch  # a resumed run's batches go on where they stopped
        self.sent = 0
        self._prefetcher: Prefetcher | None = None
        self._data = data if isinstance(data, MultimodalDataset) else None
        self._archive = data if isinstance(data, ArchiveReader) else None
        self._thread = anyio.CapacityLimiter(1)  # one thread at a time talks to the workers

    async def run(self) -> None:
        try:
            if self.cfg.layout == "archive":
                serve = await self._start_archive()
            else:
                pf = await self._start()
                serve = lambda: self._serve(pf)  # noqa: E731
            async with anyio.create_task_group() as tg:

                async def stop_on_shutdown() -> None:
                    await self.shutdown.stop.wait()
                    tg.cancel_scope.cancel()

                tg.start_soon(stop_on_shutdown)
                await serve()
                tg.cancel_scope.cancel()
        except BaseExceptionGroup as group:  # the serving loop's own error, as itself
            if len(group.exceptions) == 1 and isinstance(group.exceptions[0], Exception):
                raise group.exceptions[0] from None
            raise
        finally:
            self.batches.close()
            with anyio.CancelScope(shield=True):
                await self._close()

    async def _start(self) -> Prefetcher:
        """Check the files, load their low-dim data, start the workers."""
        cfg = self.cfg
        data = self._data
        if data is None:
            data = await anyio.to_thread.run_sync(load_offline_data, cfg, self.offline)
        assert isinstance(data, MultimodalDataset)
        self.action_stats = (data.action_mean, data.action_std)
        pf = Prefetcher(
            data,
            batch_size=cfg.batch_size,
            depth=cfg.depth + cfg.workers,  # slots: channel depth + one per worker + trainer's
            workers=cfg.workers,
            image_size=cfg.image_size,
            seed=cfg.seed,
            chunk_cache_bytes=cfg.chunk_cache_bytes,
            first_batch=self.first_batch,
        )
        self._prefetcher = pf
        await anyio.to_thread.run_sync(pf.start, limiter=self._thread)
        log.info(
            "prefetching",
            transitions=len(data),
            files=len(data.files),
            workers=cfg.workers,
            slots=pf.slots,
            slot_bytes=pf.slot_bytes,
        )
        return pf

    async def _serve(self, pf: Prefetcher) -> None:
        self.ready.set()
        pool: LeasePool[int] = LeasePool(list(range(pf.slots)), name="prefetch")
        in_flight: deque[tuple[int, Lease[int]]] = deque()
        waited = 0.0
        try:
            while True:
                while pool.free:  # every free slot goes to a worker at once
                    lease = pool.acquire_nowait()
                    in_flight.append((pf.submit(lease.buffer), lease))
                if not in_flight:  # every slot is downstream: wait for the trainer
                    lease = await pool.acquire()
                    in_flight.append((pf.submit(lease.buffer), lease))
                seq, lease = in_flight.popleft()
                try:
                    batch = await anyio.to_thread.run_sync(pf.collect, seq, limiter=self._thread)
                except BaseException:
                    lease.release()
                    raise
                lease.meta["batch"] = batch
                lease.meta["seq"] = seq
                waited, waited_before = pf.stats().wait_seconds_total, waited
                self.on_batch(waited - waited_before)  # this batch's wait for the workers
                if not await self._hand_over(lease):
                    return
        finally:
            for _, lease in in_flight:
                lease.release()

    async def _start_archive(self) -> Callable[[], Awaitable[None]]:
        """Rollout archives (storage/episode_store.py): uniform transitions for BC of the
        navigation policy. `ArchiveReader` decodes in this process (`prefetch.workers = 1`)
        or in `prefetch.workers` decode processes (storage/decode_pool.py).
        Each batch is an owned TensorDict, lent under a lease from a pool of `depth + 1`
        so the memory stays bounded the same way. `offline.max_samples` is not applied."""
        cfg = self.cfg
        reader = self._archive
        if reader is None:
            reader = await anyio.to_thread.run_sync(load_offline_data, cfg, self.offline)
            assert isinstance(reader, ArchiveReader)
            self._archive = reader
        log.info("prefetching from archives", files=len(reader.files), frames=reader.frames)
        self.ready.set()
        pool: LeasePool[int] = LeasePool(list(range(cfg.depth + 1)), name="prefetch")

        async def serve() -> None:
            while True:
                lease = await pool.acquire()
                try:
                    t0 = time.perf_counter()
                    seq = self.first_batch + self.sent
                    rng = np.random.default_rng([cfg.seed, seq])
                    batch = await anyio.to_thread.run_sync(
                        reader.sample, cfg.batch_size, rng, limiter=self._thread
                    )
                    self.on_batch(time.perf_counter() - t0)
                    lease.meta["batch"] = batch
                    lease.meta["seq"] = seq
                except BaseException:
                    lease.release()
                    raise
                if not await self._hand_over(lease):
                    return

        return serve

    async def _hand_over(self, lease: Lease) -> bool:
        """Send a filled lease to the trainer; False (lease released) once it has gone."""
        try:
            await self.batches.send(lease)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            lease.release()
            return False  # the trainer is gone (offline.steps done)
        except BaseException:
            lease.release()
            raise
        self.sent += 1
        return True

    async def _close(self) -> None:
        if self._prefetcher is not None:
            await anyio.to_thread.run_sync(self._prefetcher.close, limiter=self._thread)
        if self._archive is not None:
            await anyio.to_thread.run_sync(self._archive.close, limiter=self._thread)
            self._archive = None

    async def flush(self, deadline: float) -> None:
        """Nothing to write; the workers are stopped when `run` ends."""
        await self._close()


def load_offline_data(
    cfg: PrefetchConfig, offline: OfflineConfig
) -> MultimodalDataset | ArchiveReader:
    """Check the files of `prefetch.paths` and load what stays in RAM: a `MultimodalDataset`
    (layouts A/B) or an open `ArchiveReader`. DataError (exit 65) naming file, key,
    expected and found when one is bad."""
    paths = expand_paths(cfg.paths)
    if cfg.layout == "archive":
        # Threads do not scale these short decodes; processes do (docs/archive.md).
        return ArchiveReader(paths, workers=cfg.workers, processes=cfg.workers > 1)
    return MultimodalDataset.load(paths, layout=cfg.layout, max_samples=offline.max_samples)
