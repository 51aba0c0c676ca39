"""Host copies of a training state, taken without holding the trainer up.

A checkpoint begins as a copy of every tensor of the state into a *slot*: a set of host
buffers, one per tensor, allocated on first use and reused from then on. `stage` only
*starts* the copies and returns:

- from a GPU, the copies go into pinned buffers, non-blocking, on the current stream;
- on the CPU, they run on the staging's own copier thread, through numpy (a memcpy that
  releases the GIL and starts no OpenMP team next to the compute thread's).

Until the copies are done the source tensors must not change: whoever mutates them (the
trainer, before its next update) calls `fence()` first. On the CPU that is where a
checkpoint can cost the trainer anything at all, and only when the next update begins
before the copy has finished (the rollout collection in between usually hides it). The
writer waits for the copies (`StagedState.ready`) before serialising and gives the slot
back (`release`) when the file is written or the snapshot was dropped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from navrl_daemon.host_copy import as_numpy

_Slot = dict[str, torch.Tensor]
_Copy = tuple[torch.Tensor, torch.Tensor]  # (host buffer, source)


@dataclass
class StagedState:
    state: dict[str, Any]
    _event: Any = None  # a torch.cuda.Event after non-blocking copies
    _future: Future[None] | None = None  # the copier thread's work on the CPU
    _release: Callable[[], None] = field(default=lambda: None)

    def ready(self) -> None:
        """Block until the host copies are complete; re-raises a failed copy."""
        if self._event is not None:
            self._event.synchronize()
        if self._future is not None:
            self._future.result()

    def release(self) -> None:
        """Hand the buffers back for reuse; call once, after the state has been written.
        Waits for copies still running (only a snapshot dropped at once can have any)."""
        release, self._release = self._release, lambda: None
        if self._future is not None:
            wait([self._future])
        release()


class SnapshotStaging:
    """A pool of host slots. `max_slots` bounds memory: with a coalescing writer queue of
    size Q, Q + 2 slots (Q waiting, one being written, one being filled) always suffice."""

    def __init__(self, max_slots: int) -> None:
        if max_slots < 1:
            raise ValueError(f"max_slots must be >= 1, got {max_slots}")
        self.max_slots = max_slots
        self._free: list[_Slot] = []
        self._allocated = 0
        self._lock = threading.Lock()  # release() runs on the writer's thread
        self._copier: ThreadPoolExecutor | None = None
        self._pending: Future[None] | None = None  # the newest CPU copy (FIFO thread)
        self._closed = False

    @property
    def slots_in_use(self) -> int:
        with self._lock:
            return self._allocated - len(self._free)

    def stage(self, state: dict[str, Any]) -> StagedState:
        """Start copying every tensor of `state` into a free slot. Raises RuntimeError when
        all `max_slots` are in use (a writer that never releases). The sources must stay
        unchanged until `fence()` returns."""
        if self._closed:
            raise RuntimeError("snapshot staging is closed")
        slot = self._take()
        copies: list[_Copy] = []
        try:
            staged = _plan(state, slot, "", copies)
            host = [(buf, src) for buf, src in copies if not src.is_cuda]
            for buf, src in copies:
                if src.is_cuda:
                    buf.copy_(src, non_blocking=True)
        except BaseException:
            self._give_back(slot)
            raise
        event = None
        if len(host) < len(copies):
            event = torch.cuda.Event()
            event.record()
        future = self._start(host) if host else None
        return StagedState(staged, event, future, lambda: self._give_back(slot))

    def fence(self) -> None:
        """Block until every copy started so far has read its sources (CPU copies; GPU
        copies are ordered on the stream before any later kernel). A failed copy is not
        raised here but by its `ready()`: the writer's problem, not the trainer's."""
        pending = self._pending
        if pending is not None:
            wait([pending])

    def close(self, *, wait: bool = True) -> None:
        """No more stages. Copies already started still finish (`wait=False` does not
        wait for them; the copier thread ends once they are done)."""
        self._closed = True
        if self._copier is not None:
            self._copier.shutdown(wait=wait)

    def _start(self, copies: list[_Copy]) -> Future[None]:
        if self._copier is None:
            self._copier = ThreadPoolExecutor(1, thread_name_prefix="snapshot-copy")
        future = self._copier.submit(_run_copies, copies)
        self._pending = future
        return future

    def _take(self) -> _Slot:
        with self._lock:
            if self._free:
                return self._free.pop()
            if self._allocated >= self.max_slots:
                raise RuntimeError(f"all {self.max_slots} snapshot slots are in use")
            self._allocated += 1
            return {}

    def _give_back(self, slot: _Slot) -> None:
        with self._lock:
            self._free.append(slot)


def _plan(value: Any, slot: _Slot, path: str, copies: list[_Copy]) -> Any:
    """The staged structure, with host buffers in place of tensors; the copies to make."""
    if isinstance(value, torch.Tensor):
        src = value.detach()
        buf = slot.get(path)
        if buf is None or buf.shape != src.shape or buf.dtype != src.dtype:
            buf = torch.empty(src.shape, dtype=src.dtype, pin_memory=src.is_cuda)
            slot[path] = buf
        copies.append((buf, src))
        return buf
    if isinstance(value, dict):
        return type(value)((k, _plan(v, slot, f"{path}/{k}", copies)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return type(value)(_plan(v, slot, f"{path}/{i}", copies) for i, v in enumerate(value))
    return value


def _run_copies(copies: list[_Copy]) -> None:
    for buf, src in copies:
        np.copyto(as_numpy(buf), as_numpy(src), casting="no")
