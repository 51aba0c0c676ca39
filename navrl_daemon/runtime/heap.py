"""Large buffers come from and go back to the system, so a daemon's RSS stays where it is.

glibc serves an allocation of at least the mmap threshold with a mapping of its own that
`free` unmaps, and anything smaller from its arenas (one per thread that allocates, up to
8 per core), which keep freed memory for reuse and give back only what sits at a heap's
top. The threshold starts at 128 KiB but is dynamic: freeing a mapped block raises it to
that block's size (up to 32 MiB). After the daemon's first checkpoint encode or archive
write frees a buffer of a few MB, every tensor up to that size comes from an arena, and
threads that allocate and free such buffers at different times (collector, learner, the
encoder and compressor pools) leave holes in every arena: live data stays flat while RSS
climbs with the iterations (+13 MB/h at the default config with a checkpoint every
iteration). Pinning the threshold turns the dynamic raise off.

The daemon pins it at `run.mmap_threshold_bytes`. The default, 1 MiB, maps the multi-MB
checkpoint and archive buffers and leaves smaller tensors to the arenas: 0-2 % of CPU
frames/s. glibc's own starting value, 128 KiB, maps many of the tensors a rollout and an
update make too, a syscall and fresh zeroed pages each: 5-30 % (benchmarks/heap_pin.py).
0 leaves the dynamic threshold. A threshold set by the user (`MALLOC_MMAP_THRESHOLD_`, or
`glibc.malloc.mmap_threshold` in `GLIBC_TUNABLES`) is left alone; without glibc's
`mallopt` (musl, macOS) nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

MMAP_THRESHOLD = 1024 * 1024  # run.mmap_threshold_bytes's default
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)


def user_threshold() -> bool:
    """Whether the environment already sets glibc's mmap threshold."""
    return "MALLOC_MMAP_THRESHOLD_" in os.environ or "glibc.malloc.mmap_threshold" in (
        os.environ.get("GLIBC_TUNABLES", "")
    )


def pin_mmap_threshold(nbytes: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at `nbytes` for this process; True when it was set here
    (False: the user set one, or this C library has no `mallopt`)."""
    if user_threshold():
        return False
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt if name else None
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, nbytes))
