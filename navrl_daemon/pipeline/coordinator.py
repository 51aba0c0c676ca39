"""What the ranks of a run agree on, behind one protocol, so stages never ask whether
they run alone: `SingleProcess` here (the daemon alone), the distributed one in
pipeline/ranks.py (process groups over torch.distributed).

- the producer, once before each rollout: stop now? and at which curriculum stage? (only
  rank 0 evaluates, so only its stage moves; the others follow at the same rollout);
- the producer, after each rollout: the finished-episode stat sums of every rank's envs,
  and, when the next update is checkpointed or the run ends, every rank's env state;
- the wiring, at start-up: which checkpoint to resume from (rank 0's choice), the weights
  every rank starts with (rank 0's), and this rank's part of a checkpoint's env states;
- the trainer, at a rollback: the checkpointed learner state (rank 0 loads it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import structlog
import torch

from navrl_daemon.pipeline import resume
from navrl_daemon.rl.data_parallel import DataParallel
from navrl_daemon.rl.learner import Learner
from navrl_daemon.runtime.distributed import World
from navrl_daemon.storage.checkpoint import CheckpointDir

log = structlog.get_logger("distributed")

# The newest valid checkpoint: its path, header and state (pipeline/resume.py).
Found = tuple[Path, Any, dict[str, Any]]


class Coordinator(Protocol):
    world: World
    # What the learner reduces its update with over the ranks (None: this process alone).
    reducer: DataParallel | None

    async def agree(self, stopping: bool, stage: int) -> tuple[bool, int]:
        """Stop if any rank wants to; train at the highest curriculum stage any has."""
        ...

    async def sum_episodes(
        self, sums_count: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The finished-episode stat sums of every rank's envs."""
        ...

    async def gather_collectors(self, state: dict[str, Any] | None) -> dict[str, Any] | None:
        """Every rank's collector state as a checkpoint keeps it (None off rank 0, or when
        a rank's env cannot save its state)."""
        ...

    def newest_checkpoint(self, checkpoints: CheckpointDir) -> Found | None:
        """The checkpoint every rank resumes from (or the DataError of looking for it)."""
        ...

    def share_weights(self, policy: torch.nn.Module) -> None:
        """Rank 0's weights on every rank."""
        ...

    def rollback(self, checkpoints: CheckpointDir, learner: Learner) -> Path:
        """Load the newest checkpoint's learner state into `learner`; returns its path."""
        ...

    def close(self) -> None: ...


class SingleProcess:
    """The daemon alone: everything agreed is its own."""

    reducer: DataParallel | None = None

    def __init__(self) -> None:
        self.world = World()

    async def agree(self, stopping: bool, stage: int) -> tuple[bool, int]:
        return stopping, stage

    async def sum_episodes(
        self, sums_count: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return sums_count

    async def gather_collectors(self, state: dict[str, Any] | None) -> dict[str, Any] | None:
        return state

    def newest_checkpoint(self, checkpoints: CheckpointDir) -> Found | None:
        return resume.newest_checkpoint(checkpoints)

    def share_weights(self, policy: torch.nn.Module) -> None:
        pass

    def rollback(self, checkpoints: CheckpointDir, learner: Learner) -> Path:
        return resume.load_learner(checkpoints, learner)

    def close(self) -> None:
        pass


def collector_for_rank(collected: dict[str, Any] | None, world: World) -> dict[str, Any] | None:
    """This rank's part of a checkpoint's collector state, or None to start new episodes
    (then says why). A single-process checkpoint has world size 1."""
    if collected is None:
        return None
    saved_world = int(collected.get("world_size", 1))
    if saved_world != world.world_size:
        log.warning(
            "world size changed since the checkpoint: model, optimisers and counters are "
            "restored; every rank's envs are re-seeded and start new episodes",
            checkpoint_world_size=saved_world,
            world_size=world.world_size,
        )
        return None
    if world.rank == 0:
        return collected
    return collected["peers"][world.rank - 1]
