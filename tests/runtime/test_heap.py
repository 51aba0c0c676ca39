"""A pinned mmap threshold keeps large buffers out of glibc's arenas (runtime/heap.py).

Each case runs in a fresh interpreter (the threshold is process-wide and can only be
observed before anything else moved it): free an 8 MiB block, which raises glibc's dynamic
threshold above 1 MiB, then allocate 1 MiB and read from `mallinfo2` whether it was mapped
on its own (given back to the system when freed) or carved from an arena.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import subprocess
import sys

import pytest

PROBE = """
import ctypes, ctypes.util, sys
from navrl_daemon.runtime import heap

libc = ctypes.CDLL(ctypes.util.find_library("c"))
names = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in names.split()]
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]

pinned = heap.pin_mmap_threshold()
libc.free(libc.malloc(8 << 20))
mapped = libc.mallinfo2().hblkhd
block = libc.malloc(1 << 20)
print(int(pinned), libc.mallinfo2().hblkhd - mapped)
libc.free(block)
"""


def _has_mallinfo2() -> bool:
    name = ctypes.util.find_library("c")
    return bool(name) and hasattr(ctypes.CDLL(name), "mallinfo2")


pytestmark = pytest.mark.skipif(not _has_mallinfo2(), reason="needs glibc >= 2.33")


def _probe(env: dict[str, str], *, pin: bool) -> tuple[bool, int]:
    script = PROBE if pin else PROBE.replace("heap.pin_mmap_threshold()", "False")
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    return bool(int(out[0])), int(out[1])


def _env(**extra: str) -> dict[str, str]:
    """This environment without a threshold of its own, plus `extra`."""
    unset = ("MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")
    return {**{k: v for k, v in os.environ.items() if k not in unset}, **extra}


def test_without_the_pin_a_freed_large_block_moves_the_threshold() -> None:
    """What the pin is for: glibc's default puts the 1 MiB block in an arena."""
    pinned, mapped = _probe(_env(), pin=False)
    assert not pinned and mapped == 0


def test_pinned_a_large_block_is_mapped_on_its_own() -> None:
    pinned, mapped = _probe(_env(), pin=True)
    assert pinned
    assert mapped >= 1 << 20


@pytest.mark.parametrize(
    "user",
    [
        {"MALLOC_MMAP_THRESHOLD_": str(16 << 20)},
        {"GLIBC_TUNABLES": f"glibc.malloc.mmap_threshold={16 << 20}"},
    ],
)
def test_a_threshold_the_user_set_is_kept(user: dict[str, str]) -> None:
    pinned, mapped = _probe(_env(**user), pin=True)
    assert not pinned
    assert mapped == 0  # 1 MiB is under the user's 16 MiB: from an arena, as they asked
