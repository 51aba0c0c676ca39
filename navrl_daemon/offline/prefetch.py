"""Batches of a `MultimodalDataset`, images read and resized by worker processes.

Why processes: h5py holds one global lock per process, so threads would read one at a
time. Each worker is started with the *spawn* method and opens its own HDF5 handles after
start; no handle ever crosses a fork.

How batches travel: the images of a batch are written by a worker straight into one of
`depth + 1` preallocated shared-memory slots; only small messages (sequence number, slot,
sorted indices) are pickled. Slots are stored channels-last (`[batch, cameras, size,
size, 3]` uint8, so the resize output lands with row copies, not a transpose) and seen as
`[batch, cameras, 3, size, size]` views: `.contiguous()` where a dense NCHW copy is
needed. Low-dimensional data never leaves the parent (it is in RAM there).

Order and determinism: batch `seq` holds the `seq`-th run of `batch_size` positions of a
sequence of per-epoch permutations drawn from `seed`, sorted within the batch (sorted
reads); batch `seq` goes to worker `seq % workers`, over one duplex pipe per worker, and
comes back in order. So the batches depend on the seed, the dataset and the batch size,
not on the number of workers or their timing.

Bounded: with `next()`, `depth` batches are being read or are ready while the consumer
holds one; the batch returned by `next()` stays valid until the following `next()` (or
`close()`): copy what must live longer (moving it to a GPU copies). A caller that lends
slots out itself (the HDF5Prefetcher stage, through a lease pool) uses `submit(slot)` and
`collect(seq)` instead.

Shutdown: `close()` (or leaving the `with` block) asks workers to stop, then terminates
any that do not within a grace period, and unlinks the slots. A worker also exits on its
own when its pipe to the parent closes or its parent pid changes (the parent was killed),
and the multiprocessing resource tracker unlinks the slots of a killed parent.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.shared_memory import SharedMemory
from typing import Any, NoReturn

import numpy as np
import torch
from tensordict import TensorDict

from navrl_daemon.errors import ConfigError, DataError
from navrl_daemon.offline.datasets import CAMERAS, MultimodalDataset
from navrl_daemon.offline.prefetch_worker import slot_view, worker_main
from navrl_daemon.storage.worker_processes import stop_workers


@dataclass(frozen=True)
class PrefetchStats:
    batches: int
    wait_seconds_total: float  # time `next()` spent waiting for a worker


class BatchSchedule:
    """Which transitions batch `seq` holds: sorted, from per-epoch seeded permutations."""

    def __init__(self, size: int, batch_size: int, seed: int) -> None:
        self.size, self.batch_size, self.seed = size, batch_size, seed
        self._epoch = -1
        self._perm = np.empty(0, dtype=np.int64)

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.size)
            self._epoch = epoch
        return self._perm

    def indices(self, seq: int) -> np.ndarray:
        positions = np.arange(seq * self.batch_size, (seq + 1) * self.batch_size)
        out = np.empty(self.batch_size, dtype=np.int64)
        for epoch in np.unique(positions // self.size):
            mask = positions // self.size == epoch
            out[mask] = self._permutation(int(epoch))[positions[mask] % self.size]
        out.sort()
        return out


class Prefetcher:
    """`next()` → TensorDict `[batch]`: `images` uint8 `[B, 3 cameras, 3, S, S]` (left,
    right, global), `joint`, `next_joint`, `action`, `reward`, `terminal`, `index`."""

    def __init__(
        self,
        dataset: MultimodalDataset,
        *,
        batch_size: int,
        depth: int = 4,
        workers: int = 2,
        image_size: int = 224,
        seed: int = 0,
        chunk_cache_bytes: int = 64 << 20,
        start_timeout_s: float = 120.0,
        first_batch: int = 0,
    ) -> None:
        """`first_batch`: the number of the first batch to serve, so a resumed run goes on
        with the batches it had not yet seen (the schedule is a pure function of it)."""
        if min(batch_size, depth, workers, image_size) < 1:
            raise ValueError("batch_size, depth, workers and image_size must be >= 1")
        self.dataset = dataset
        self.batch_size, self.depth, self.image_size = batch_size, depth, image_size
        self.schedule = BatchSchedule(len(dataset), batch_size, seed)
        # Stored channels-last: the resize writes it with row copies, not a transpose.
        self.slot_shape = (batch_size, len(CAMERAS), image_size, image_size, 3)
        self._chunk_cache_bytes = chunk_cache_bytes
        self._start_timeout_s = start_timeout_s
        self._workers = workers
        self._procs: list[Any] = []
        self._conns: list[Connection] = []
        self._shms: list[SharedMemory] = []
        self._views: list[torch.Tensor] = []
        self._first = first_batch
        self._next_seq = first_batch  # next batch to hand out
        self._submitted = first_batch  # next batch to ask a worker for
        self._slot_of: dict[int, int] = {}  # submitted, not yet collected batches
        self._wait_s = 0.0
        self._closed = False

    # ---------------------------------------------------------------- lifecycle

    def __enter__(self) -> Prefetcher:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    @property
    def slot_names(self) -> list[str]:
        """The shared-memory blocks (under /dev/shm) holding the batch slots."""
        return [s.name for s in self._shms]

    @property
    def slot_bytes(self) -> int:
        return int(np.prod(self.slot_shape))

    def start(self) -> None:
        """Allocate the slots, start the workers, wait until each has opened its files."""
        try:
            self._allocate()
            ctx = mp.get_context("spawn")
            names = [s.name for s in self._shms]
            for k in range(self._workers):
                parent_end, child_end = ctx.Pipe(duplex=True)
                proc = ctx.Process(
                    target=worker_main,
                    name=f"navrl-prefetch-{k}",
                    args=(
                        child_end,
                        os.getpid(),
                        self.dataset.files,
                        self.dataset.offsets,
                        self.image_size,
                        self._chunk_cache_bytes,
                        names,
                        self.slot_shape,
                    ),
                    daemon=True,
                )
                proc.start()
                child_end.close()  # only the worker holds it: its EOF is our death
                self._procs.append(proc)
                self._conns.append(parent_end)
            deadline = time.monotonic() + self._start_timeout_s
            for k in range(self._workers):
                self._receive(k, expect=("ready", -1), deadline=deadline)
        except BaseException:
            self.close()
            raise

    def _allocate(self) -> None:
        need = (self.depth + 1) * self.slot_bytes
        try:
            st = os.statvfs("/dev/shm")
            free = st.f_bavail * st.f_frsize
        except OSError:
            free = None
        if free is not None and need > free:
            raise ConfigError(
                f"prefetch: {self.depth + 1} slots of {self.slot_bytes} bytes (depth + 1 "
                f"batches of prefetch.batch_size images) need {need} bytes of /dev/shm, "
                f"{free} free: lower prefetch.depth or prefetch.batch_size, or enlarge /dev/shm"
            )
        for _ in range(self.depth + 1):
            shm = SharedMemory(create=True, size=self.slot_bytes)
            self._shms.append(shm)
            self._views.append(slot_view(shm, self.slot_shape))

    def close(self) -> None:
        """Stop the workers (terminating any that do not stop within 2 s), unlink slots."""
        if self._closed:
            return
        self._closed = True
        stop_workers(self._procs, self._conns)
        for proc in self._procs:
            proc.close()
        self._views.clear()
        for shm in self._shms:
            # BufferError: the caller still holds a batch view; unmapped when it goes.
            with contextlib.suppress(BufferError):
                shm.close()
            shm.unlink()
        self._shms.clear()

    # ---------------------------------------------------------------- batches

    def stats(self) -> PrefetchStats:
        return PrefetchStats(batches=self._next_seq - self._first, wait_seconds_total=self._wait_s)

    @property
    def slots(self) -> int:
        return self.depth + 1

    def next(self) -> TensorDict:
        """The next batch; the previous one's images are overwritten from now on."""
        seq = self._next_seq
        if seq == self._first:
            for slot in range(self.slots):
                self.submit(slot)
        else:
            self.submit((seq - 1 - self._first) % self.slots)  # batch seq - 1 is done with
        return self.collect(seq)

    def submit(self, slot: int) -> int:
        """Ask for the next batch into `slot` (not in use by anyone); returns its number.
        For callers that manage slots themselves (the HDF5Prefetcher stage); don't mix
        with `next()`."""
        if self._closed or not self._procs:
            raise RuntimeError("prefetcher is not running")
        seq = self._submitted
        k = seq % self._workers
        try:
            self._conns[k].send((seq, slot, self.schedule.indices(seq)))
        except OSError:  # its end of the pipe is closed: it died
            self._dead(k)
        self._slot_of[seq] = slot
        self._submitted += 1
        return seq

    def collect(self, seq: int) -> TensorDict:
        """Wait for batch `seq`, the oldest submitted and not yet collected; its `images`
        are a view of its slot, valid until the slot is submitted again."""
        if seq != self._next_seq or seq not in self._slot_of:
            raise RuntimeError(f"collect({seq}): batch {self._next_seq} is next")
        t0 = time.perf_counter()
        self._receive(seq % self._workers, expect=("done", seq), deadline=None)
        self._wait_s += time.perf_counter() - t0
        self._next_seq += 1
        indices = self.schedule.indices(seq)
        fields = self.dataset.lowdim(indices)
        fields["images"] = self._views[self._slot_of.pop(seq)]
        fields["index"] = torch.from_numpy(indices)
        return TensorDict(fields, batch_size=[self.batch_size])

    def _receive(self, k: int, *, expect: tuple[str, int], deadline: float | None) -> None:
        """Wait for worker `k`'s message `expect`; its error, death or silence raises."""
        conn, proc = self._conns[k], self._procs[k]
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready = wait([conn, proc.sentinel], timeout)
        if conn in ready:
            try:
                kind, seq, text = conn.recv()
            except (EOFError, OSError):  # OSError: reset, it died with our tasks unread
                kind, seq, text = "gone", -1, ""
            if kind == "data_error":
                raise DataError(text)
            if kind == "error":
                raise RuntimeError(f"prefetch worker {k} (pid {proc.pid}): {text}")
            if (kind, seq) == expect:
                return
            if kind != "gone":
                raise RuntimeError(f"prefetch worker {k}: expected {expect}, got {(kind, seq)}")
        elif proc.sentinel not in ready:
            raise RuntimeError(
                f"prefetch worker {k} (pid {proc.pid}): not ready after {self._start_timeout_s} s"
            )
        self._dead(k)

    def _dead(self, k: int) -> NoReturn:
        proc = self._procs[k]
        proc.join(1.0)
        raise RuntimeError(f"prefetch worker {k} (pid {proc.pid}) exited with code {proc.exitcode}")
