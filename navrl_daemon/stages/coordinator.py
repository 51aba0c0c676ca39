"""What the producer agrees on with the other ranks of a distributed run.

The distributed implementation is the pipeline's (pipeline/ranks.py: process groups over
torch.distributed); the stages see only this protocol.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch


class Coordinator(Protocol):
    def agree(self, stopping: bool, stage: int = 0) -> tuple[bool, int]:
        """Stop if any rank wants to; train at the highest curriculum stage any has."""
        ...

    def sum_episodes(
        self, sums_count: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The finished-episode stat sums of every rank's envs."""
        ...

    def gather_collectors(self, state: dict[str, Any] | None) -> dict[str, Any] | None:
        """Every rank's collector state, as the checkpoint keeps it (None off rank 0)."""
        ...
