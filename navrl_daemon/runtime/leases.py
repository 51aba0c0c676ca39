"""A fixed pool of preallocated buffers lent out under reference-counted leases.

This is NavRL's zero-copy `return_same_td=True` made safe: the producer acquires a free
buffer (waiting while every buffer is out, which is its backpressure), fills it in place,
then `share`s its lease into one handle per consumer. The buffer goes back to the pool
only when every handle is released, so no consumer can see it overwritten while it holds
its handle.

Each lending of a slot has a generation number. A released handle, or any handle of an
older lending, raises `LeaseError` instead of touching the buffer: a bug shows up as an
error, never as silent aliasing.

Use from one event-loop thread only, inside the running loop (the pool waits on an anyio
semaphore). Work on `lease.buffer` may run in a worker thread, but `acquire`, `share` and
`release` belong on the loop (release after
`anyio.to_thread.run_sync` returns, or through `anyio.from_thread.run_sync`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

import anyio

T = TypeVar("T")


class LeaseError(RuntimeError):
    """A lease handle was used after release, released twice, or shared after release."""


class LeasePool(Generic[T]):
    def __init__(self, buffers: Sequence[T], name: str = "rollouts") -> None:
        if len(buffers) < 1:
            raise ValueError(f"lease pool {name!r} needs at least one buffer")
        self.name = name
        self._buffers = list(buffers)
        self._free = deque(range(len(self._buffers)))
        # One token per free slot: anyio's semaphore gives FIFO, cancel-safe waiting.
        self._tokens = anyio.Semaphore(len(self._buffers), max_value=len(self._buffers))
        self._generations = [0] * len(self._buffers)
        self._waiting_seconds = 0.0

    @property
    def size(self) -> int:
        return len(self._buffers)

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def waiting_seconds(self) -> float:
        """Total time `acquire` spent waiting for a buffer to come back."""
        return self._waiting_seconds

    async def acquire(self) -> Lease[T]:
        """Borrow a free buffer, waiting (first come, first served) while none is free."""
        if self._tokens.value > 0:
            await self._tokens.acquire()
        else:
            start = time.perf_counter()
            try:
                await self._tokens.acquire()
            finally:
                self._waiting_seconds += time.perf_counter() - start
        return self._lend()

    def acquire_nowait(self) -> Lease[T]:
        """Borrow a free buffer now, or raise `anyio.WouldBlock`."""
        self._tokens.acquire_nowait()
        return self._lend()

    def _lend(self) -> Lease[T]:
        slot = self._free.popleft()
        self._generations[slot] += 1
        return Lease(_Lending(self, slot, self._generations[slot]))

    def _return(self, slot: int) -> None:
        self._free.append(slot)
        self._tokens.release()

    def __repr__(self) -> str:
        return f"<LeasePool {self.name!r} {self.free}/{self.size} free>"


class _Lending(Generic[T]):
    """One lending of one slot, shared by every handle derived from its first lease."""

    def __init__(self, pool: LeasePool[T], slot: int, generation: int) -> None:
        self.pool = pool
        self.slot = slot
        self.generation = generation
        self.meta: dict[str, Any] = {}
        self.holders = 1

    @property
    def current(self) -> bool:
        return self.pool._generations[self.slot] == self.generation and self.holders > 0


class Lease(Generic[T]):
    """One handle on a lent buffer; release it exactly once (or `share` it)."""

    def __init__(self, lending: _Lending[T]) -> None:
        self._lending = lending
        self._released = False

    @property
    def slot(self) -> int:
        return self._lending.slot

    @property
    def generation(self) -> int:
        return self._lending.generation

    @property
    def meta(self) -> dict[str, Any]:
        """Free-form facts about this lending (iteration, policy version, ...)."""
        return self._lending.meta

    @property
    def released(self) -> bool:
        return self._released

    @property
    def buffer(self) -> T:
        self._check("read the buffer of")
        return self._lending.pool._buffers[self.slot]

    def share(self, holders: int) -> list[Lease[T]]:
        """Turn this handle into `holders` handles on the same buffer; this one is released.

        The buffer returns to the pool once every returned handle is released; with
        `holders == 0` it returns at once.
        """
        if holders < 0:
            raise ValueError(f"holders must be >= 0, got {holders}")
        if holders == 0:
            self.release()
            return []
        self._check("share")
        self._released = True
        self._lending.holders += holders - 1
        return [Lease(self._lending) for _ in range(holders)]

    def release(self) -> None:
        """Give this handle back; the buffer returns to the pool with its last handle."""
        self._check("release")
        self._released = True
        self._lending.holders -= 1
        if self._lending.holders == 0:
            self._lending.pool._return(self.slot)

    def _check(self, action: str) -> None:
        if self._released or not self._lending.current:
            raise LeaseError(
                f"cannot {action} lease on {self._lending.pool.name!r} slot {self.slot} "
                f"(generation {self.generation}): already released"
            )

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self._released:
            self.release()

    def __repr__(self) -> str:
        state = "released" if self._released else "held"
        return f"<Lease {self._lending.pool.name!r} slot={self.slot} gen={self.generation} {state}>"
