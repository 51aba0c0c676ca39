"""Copies of tensors into host memory that do not go through torch's CPU kernels.

A CPU `Tensor.clone()` or `.to("cpu", copy=True)` runs torch's copy kernel, which on a
busy machine can cost ~1 ms per call even for a few bytes (its OpenMP team waits for
descheduled threads), and from a thread other than the compute thread it starts a second
team that slows the trainer's update. numpy's copy is a plain memcpy that releases the
GIL and starts no thread team (docs/checkpoints.md).
"""

from __future__ import annotations

import numpy as np
import torch

# Dtypes numpy lacks (bfloat16, float8...) go through as the signed integer of their
# width, which is exact for every bit pattern.
_AS_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """A numpy view of a CPU tensor's memory, whatever its dtype."""
    t = t.detach()
    try:
        return t.numpy()
    except TypeError:  # a dtype numpy lacks
        return t.view(_AS_INT[t.element_size()]).numpy()


def host_copy(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy in host memory with t's dtype and shape (from any device)."""
    if t.device.type != "cpu":
        return t.detach().to("cpu", copy=True)
    out = torch.empty(t.shape, dtype=t.dtype)
    np.copyto(as_numpy(out), as_numpy(t), casting="no")
    return out
