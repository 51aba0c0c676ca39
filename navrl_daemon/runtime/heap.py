"""Freed memory goes back to the system, so a daemon's RSS says what it holds.

glibc keeps memory that was freed inside its arenas (one per thread that allocated, up to
8 per core) for the next allocation, and only gives back what sits at the top of a heap.
A daemon whose threads allocate and free large buffers at different times (checkpoint
encoding, archive compression, rollout staging) leaves free holes in every arena: live data
stays flat while RSS climbs by megabytes an hour until the holes happen to be reused.
`malloc_trim(0)` walks every arena and returns each free page to the system (madvise), at
a cost of milliseconds; `trim_periodically` calls it from a worker thread every few
seconds of wall time. On a C library without `malloc_trim` (musl, macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable

import anyio


@functools.cache
def malloc_trim() -> Callable[[], bool] | None:
    """glibc's `malloc_trim(0)` (True when it gave memory back), or None without glibc."""
    name = ctypes.util.find_library("c")
    try:
        fn = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        fn = None
    if fn is None:
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return lambda: bool(fn(0))


async def trim_periodically(interval_s: float) -> None:
    """Give freed heap memory back every `interval_s` seconds until cancelled (0: never)."""
    trim = malloc_trim()
    if trim is None or interval_s <= 0:
        return
    while True:
        await anyio.sleep(interval_s)
        await anyio.to_thread.run_sync(trim)
