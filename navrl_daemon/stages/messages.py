"""What travels between stages besides rollout leases."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from navrl_daemon.storage.staging import StagedState


@dataclass(frozen=True)
class PolicyWeights:
    """A detached copy of the trained policy's weights after `version` updates (the
    version is also the iteration: one update per iteration)."""

    version: int
    frames: int
    state: dict[str, torch.Tensor]


@dataclass(frozen=True)
class Snapshot:
    """The full training state after `iteration` updates, staged on the host for the
    checkpoint writer; `final` marks the one taken at shutdown."""

    iteration: int
    frames: int
    staged: StagedState
    final: bool = False
