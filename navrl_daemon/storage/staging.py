"""Host copies of a training state, taken fast enough that the trainer hardly notices.

A checkpoint begins as a copy of every tensor of the state into a *slot*: a set of host
buffers, one per tensor, allocated on first use and reused from then on (pinned when the
source is on a GPU, so the copies are non-blocking and the trainer goes on while they
run). The writer waits for the copies (`StagedState.ready`) before serialising and gives
the slot back (`release`) when the file is written or the snapshot was dropped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

_Slot = dict[str, torch.Tensor]


@dataclass
class StagedState:
    state: dict[str, Any]
    _event: Any = None  # a torch.cuda.Event after non-blocking copies
    _release: Callable[[], None] = field(default=lambda: None)

    def ready(self) -> None:
        """Block until the host copies are complete (a no-op for CPU sources)."""
        if self._event is not None:
            self._event.synchronize()

    def release(self) -> None:
        """Hand the buffers back for reuse; call once, after the state has been written."""
        release, self._release = self._release, lambda: None
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

    @property
    def slots_in_use(self) -> int:
        with self._lock:
            return self._allocated - len(self._free)

    def stage(self, state: dict[str, Any]) -> StagedState:
        """Copy every tensor of `state` into a free slot. Raises RuntimeError when all
        `max_slots` are in use (a writer that never releases)."""
        slot = self._take()
        try:
            staged = _copy(state, slot, "")
        except BaseException:
            self._give_back(slot)
            raise
        event = None
        if any(b.is_pinned() for b in slot.values()):
            event = torch.cuda.Event()
            event.record()
        return StagedState(staged, event, lambda: self._give_back(slot))

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


def _copy(value: Any, slot: _Slot, path: str) -> Any:
    if isinstance(value, torch.Tensor):
        src = value.detach()
        buf = slot.get(path)
        if buf is None or buf.shape != src.shape or buf.dtype != src.dtype:
            buf = torch.empty(src.shape, dtype=src.dtype, pin_memory=src.is_cuda)
            slot[path] = buf
        buf.copy_(src, non_blocking=src.is_cuda)
        return buf
    if isinstance(value, dict):
        return type(value)((k, _copy(v, slot, f"{path}/{k}")) for k, v in value.items())
    if isinstance(value, list | tuple):
        return type(value)(_copy(v, slot, f"{path}/{i}") for i, v in enumerate(value))
    return value
