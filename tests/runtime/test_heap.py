"""Freed heap memory goes back to the system (runtime/heap.py)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import time

import anyio
import pytest

from navrl_daemon.runtime import heap

BLOCK = 64 * 1024  # under glibc's mmap threshold: served from the heap, not mmap
BLOCKS = 800


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.fixture
def libc() -> ctypes.CDLL:
    if heap.malloc_trim() is None:
        pytest.skip("no glibc malloc_trim on this system")
    lib = ctypes.CDLL(ctypes.util.find_library("c"))
    lib.malloc.restype = ctypes.c_void_p
    lib.malloc.argtypes = [ctypes.c_size_t]
    lib.free.argtypes = [ctypes.c_void_p]
    lib.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    return lib


def _hole(libc: ctypes.CDLL) -> list[int]:
    """Leave ~25 MB of freed, touched heap: every other block freed, so none of it is at
    the heap's top, where `free` itself would give it back. Returns the live blocks."""
    blocks = [libc.malloc(BLOCK) for _ in range(BLOCKS)]
    for b in blocks:
        libc.memset(b, 1, BLOCK)
    for b in blocks[::2]:
        libc.free(b)
    return blocks[1::2]


def test_trim_gives_freed_heap_memory_back(libc: ctypes.CDLL) -> None:
    keep = _hole(libc)
    held = _rss()
    heap.malloc_trim()()  # type: ignore[misc]
    released = held - _rss()
    for b in keep:
        libc.free(b)
    assert released > BLOCK * BLOCKS // 4, f"only {released} bytes went back"


def test_the_periodic_trim_runs_until_cancelled(libc: ctypes.CDLL) -> None:
    keep = _hole(libc)
    held = _rss()

    async def main() -> int:
        async with anyio.create_task_group() as tg:
            tg.start_soon(heap.trim_periodically, 0.05)
            deadline = time.monotonic() + 10
            while held - _rss() < BLOCK * BLOCKS // 4 and time.monotonic() < deadline:
                await anyio.sleep(0.05)
            tg.cancel_scope.cancel()
        return held - _rss()

    released = anyio.run(main)
    for b in keep:
        libc.free(b)
    assert released > BLOCK * BLOCKS // 4, f"only {released} bytes went back"


def test_zero_interval_is_off() -> None:
    async def main() -> None:
        with anyio.fail_after(1):
            await heap.trim_periodically(0)  # returns at once: nothing to cancel

    anyio.run(main)
