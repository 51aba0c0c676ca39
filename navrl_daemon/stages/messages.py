"""What travels between stages besides rollout leases."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PolicyWeights:
    """A detached copy of the trained policy's weights after `version` updates (the
    version is also the iteration: one update per iteration)."""

    version: int
    frames: int
    state: dict[str, torch.Tensor]
