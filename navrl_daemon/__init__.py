"""navrl-daemon: a long-running training service for NavRL's drone-navigation PPO policy."""

import os

__version__ = "0.1.0"

# torch backs its CPU tensors of 2 MB and more with transparent huge pages when this is set
# before its first allocation (it reads it once): an update's activations are tens of MB,
# mapped afresh for each tensor above the mmap threshold, and with 4 KiB pages their page
# faults were a fifth of a CPU update (runtime/heap.py; `run.huge_pages` turns them off).
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
