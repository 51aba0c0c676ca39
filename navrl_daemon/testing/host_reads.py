"""Count the ops that hand a tensor's value to the host (on CUDA, each waits for the GPU),
and find host data made into tensors (a CUDA graph capture refuses the copy).

Works on any device, the CPU included, so the tests that promise "no host sync" in a
hot loop run in CI; on CUDA `torch.cuda.set_sync_debug_mode` says the same by call site.
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# `.item()`, `bool(t)` / `if t:` and `nonzero` (its output size is data-dependent).
HOST_READS = frozenset({"aten._local_scalar_dense", "aten.is_nonzero", "aten.item", "aten.nonzero"})


class CountHostReads(TorchDispatchMode):
    """`with CountHostReads() as reads: ...`; then `reads.count`, `reads.by_op`."""

    def __init__(self) -> None:
        super().__init__()
        self.by_op: Counter[str] = Counter()

    @property
    def count(self) -> int:
        return sum(self.by_op.values())

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = str(func.overloadpacket)
        if name in HOST_READS:
            self.by_op[name] += 1
        return func(*args, **(kwargs or {}))


class HostData(TorchFunctionMode):
    """Record Python data turned into tensors inside the block: indexing with a list or
    tuple (`t[:, (2, 3)]` builds an index tensor on the host and copies it to the device on
    every call) and `torch.tensor` / `torch.as_tensor`. A CUDA graph capture refuses such a
    copy ("Cannot copy between CPU and CUDA tensors during CUDA graph capture"); on the CPU
    nothing fails, so the tests of captured steps look for it here.

    `with HostData() as host: ...`; then `host.found` (one line per use)."""

    FACTORIES = frozenset({torch.tensor, torch.as_tensor})
    INDEXING = frozenset({torch.Tensor.__getitem__, torch.Tensor.__setitem__})

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in self.FACTORIES:
            self.found.append(f"{func.__name__}() at {_caller()}")
        elif func in self.INDEXING and _has_sequence(args[1]):
            self.found.append(f"index {args[1]!r} at {_caller()}")
        return func(*args, **(kwargs or {}))


def _has_sequence(index: Any) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(part, list | tuple) for part in parts)


def _caller() -> str:
    """The innermost frame outside this file and torch: where the host data came from."""
    frame = sys._getframe(2)
    while frame is not None and (
        frame.f_code.co_filename == __file__ or "/torch/" in frame.f_code.co_filename
    ):
        frame = frame.f_back
    return "?" if frame is None else f"{frame.f_code.co_filename}:{frame.f_lineno}"
