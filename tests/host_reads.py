"""Count the ops that hand a tensor's value to the host (on CUDA, each waits for the GPU).

Works on any device, the CPU included, so the tests that promise "no host sync" in a
hot loop run in CI; on CUDA `torch.cuda.set_sync_debug_mode` says the same by call site.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

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
