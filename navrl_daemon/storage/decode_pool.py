"""Archive segments decoded by worker processes into one shared-memory arena.

Why processes: a format-2 segment decodes in one LZ4 call of ~10-20 µs. Threads hand the
GIL back and forth around every such call, and on a small VM each hand-off costs about as
much as the call, so a second decode thread gains nothing (docs/archive.md, "Thread
scaling"). Processes share no GIL: each worker opens the archive files itself (started
with *spawn*; no HDF5 handle crosses a fork), reads and decodes its share of a batch's
segments, and copies each decoded segment into the arena at the offset the parent chose.
Only small messages (segment numbers, offsets, the arena's name) are pickled.

The arena is reused from batch to batch (grown when a batch needs more), so its pages are
faulted in once, not once per batch as freshly allocated buffers are. The segments that
`decode` returns are views of it: valid until the next `decode`. Copy what must live
longer (the LRU cache stores copies).

Errors: a bad segment in a worker comes back as DataError naming file and segment; a
worker that dies or stops answering raises RuntimeError. `close()` stops the workers and
unlinks the arena; a worker also exits when its pipe to the parent closes.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path
from typing import Any

import numpy as np

from navrl_daemon.errors import DataError
from navrl_daemon.storage.segment import DecodedSegment, SegmentLayout
from navrl_daemon.storage.worker_processes import stop_workers

# A decode job: (file number, segment number in that file, its length in steps).
Job = tuple[int, int, int]
M_TRIM_THRESHOLD = -1  # glibc mallopt parameter


class DecodePool:
    """`workers` processes that decode segments of `paths` (archive files) on request."""

    def __init__(
        self, paths: Sequence[Path], workers: int, *, start_timeout_s: float = 60.0
    ) -> None:
        if workers < 1:
            raise ValueError("a decode pool needs at least one worker")
        self.paths = [Path(p) for p in paths]
        self.workers = workers
        self._procs: list[Any] = []
        self._conns: list[Connection] = []
        self._arena: SharedMemory | None = None
        self._closed = False
        try:
            ctx = mp.get_context("spawn")
            for k in range(workers):
                parent_end, child_end = ctx.Pipe(duplex=True)
                proc = ctx.Process(
                    target=_worker_main,
                    name=f"navrl-decode-{k}",
                    args=(child_end, [str(p) for p in self.paths]),
                    daemon=True,
                )
                proc.start()
                child_end.close()  # only the worker holds it: its EOF is our death
                self._procs.append(proc)
                self._conns.append(parent_end)
            deadline = time.monotonic() + start_timeout_s
            for k in range(workers):
                self._receive(k, "ready", deadline)
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def decode(self, jobs: Sequence[Job], layout: SegmentLayout) -> list[DecodedSegment]:
        """Decode these segments (each `(file, segment, length)`), in order; views of the
        arena, valid until the next call."""
        if self._closed:
            raise RuntimeError("decode pool is closed")
        sizes = [layout.segment_bytes(length) for _, _, length in jobs]
        offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        arena = self._arena_for(int(offsets[-1]))
        # Contiguous shares, one per worker: each worker writes one range of the arena.
        shares = np.array_split(np.arange(len(jobs)), self.workers)
        busy = []
        for k, share in enumerate(shares):
            if not len(share):
                continue
            tasks = [(jobs[i][0], jobs[i][1], int(offsets[i])) for i in share.tolist()]
            try:
                self._conns[k].send((arena.name, tasks))
            except OSError:  # its end of the pipe is closed: it died
                self._dead(k)
            busy.append(k)
        failure: DataError | None = None
        for k in busy:  # every answer is read, so none is left to confuse the next batch
            try:
                self._receive(k, "done", None)
            except DataError as e:
                failure = failure or e
        if failure is not None:
            raise failure
        buffer = np.ndarray((arena.size,), dtype=np.uint8, buffer=arena.buf)
        return [
            DecodedSegment(buffer[offsets[i] : offsets[i + 1]], jobs[i][2], layout)
            for i in range(len(jobs))
        ]

    def _arena_for(self, nbytes: int) -> SharedMemory:
        if self._arena is None or self._arena.size < nbytes:
            self._release_arena()
            # Headroom, so a slightly larger batch does not reallocate (and re-fault).
            self._arena = SharedMemory(create=True, size=max(1, nbytes + nbytes // 4))
        return self._arena

    def _release_arena(self) -> None:
        if self._arena is not None:
            arena, self._arena = self._arena, None
            # BufferError: a caller still holds a view; unmapped when it goes.
            with contextlib.suppress(BufferError):
                arena.close()
            arena.unlink()

    def _receive(self, k: int, expect: str, deadline: float | None) -> None:
        conn, proc = self._conns[k], self._procs[k]
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready = wait([conn, proc.sentinel], timeout)
        if conn in ready:
            try:
                kind, text = conn.recv()
            except (EOFError, OSError):
                kind, text = "gone", ""
            if kind == "data_error":
                raise DataError(text)
            if kind == "error":
                raise RuntimeError(f"decode worker {k} (pid {proc.pid}): {text}")
            if kind == expect:
                return
            if kind != "gone":
                raise RuntimeError(f"decode worker {k}: expected {expect!r}, got {kind!r}")
        elif proc.sentinel not in ready:
            raise RuntimeError(f"decode worker {k} (pid {proc.pid}): no answer in time")
        self._dead(k)

    def _dead(self, k: int) -> None:
        proc = self._procs[k]
        proc.join(1.0)
        self.close()
        raise RuntimeError(f"decode worker {k} (pid {proc.pid}) exited with code {proc.exitcode}")

    def close(self) -> None:
        """Stop the workers (terminating any that do not stop within 2 s), unlink the arena."""
        if self._closed:
            return
        self._closed = True
        stop_workers(self._procs, self._conns)
        self._release_arena()

    def __enter__(self) -> DecodePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _worker_main(conn: Connection, paths: list[str]) -> None:
    """Open the files, then decode each task's segments into the arena it names."""
    from navrl_daemon.storage.archive import ArchiveFile  # the worker's own imports

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _keep_freed_memory()
    files: list[ArchiveFile] = []
    arena: SharedMemory | None = None
    try:
        try:
            files = [ArchiveFile.open(Path(p)) for p in paths]
        except DataError as e:
            conn.send(("data_error", str(e)))
            return
        conn.send(("ready", ""))
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):  # the parent is gone
                return
            if message is None:
                return
            name, tasks = message
            try:
                if arena is None or arena.name != name:
                    if arena is not None:
                        arena.close()
                    arena = _attach(name)
                buffer = np.ndarray((arena.size,), dtype=np.uint8, buffer=arena.buf)
                for file, segment, offset in tasks:
                    decoded = files[file].segment(segment)
                    buffer[offset : offset + decoded.nbytes] = decoded.raw
                del buffer
                conn.send(("done", ""))
            except DataError as e:
                conn.send(("data_error", str(e)))
            except Exception as e:  # anything else: report it, the parent raises
                conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        for f in files:
            f.close()
        if arena is not None:
            with contextlib.suppress(BufferError):
                arena.close()
        os._exit(0)  # skip interpreter teardown: nothing of ours is left to flush


def _keep_freed_memory() -> None:
    """Tell glibc to keep freed heap memory in this worker (it decodes, frees and decodes
    again the same-sized buffers; by default the freed top of the heap goes back to the
    kernel and the next decode faults it in again). Only this process: a training process
    allocates differently, and there the setting slows torch (docs/archive.md)."""
    with contextlib.suppress(Exception):  # not glibc: nothing to tune
        ctypes.CDLL("libc.so.6").mallopt(M_TRIM_THRESHOLD, 256 << 20)


def _attach(name: str) -> SharedMemory:
    """Attach to the parent's arena. A spawned worker shares its parent's resource tracker,
    where a second registration of the same name is a no-op: the parent's unlink is the
    only one (as in prefetch_worker)."""
    return SharedMemory(name=name)
