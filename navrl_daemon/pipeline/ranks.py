"""The coordinator of a distributed run (pipeline/coordinator.py's protocol) over the
process groups of torch.distributed (torchrun; runtime/distributed.py's `World`).

`Ranks` opens them:

- the default group (NCCL on CUDA, gloo on CPU): the trainer's gradient and batch-stat
  all-reduces and the parameter checksums (rl/data_parallel.py), called only from the
  trainer's compute thread;
- `control` (gloo, CPU tensors and objects): the producer's per-iteration agreement on
  whether to go on, the episode-stat sums, the env states gathered for checkpoints, and
  the start-up broadcast of the checkpoint to resume from;
- `learner` (gloo): the rollback broadcast of the learner state, trainer thread only.

Each group is used from one thread only and in the same order on every rank, so the
producer and trainer, which run concurrently, can never cross each other's collectives.
Every collective has the `distributed.timeout_s` timeout; a rank that dies closes its
sockets and the others' next collective fails at once (gloo), so nobody hangs.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import structlog
import torch
import torch.distributed as dist

from navrl_daemon.errors import DataError
from navrl_daemon.pipeline import resume
from navrl_daemon.pipeline.coordinator import Found
from navrl_daemon.rl.data_parallel import DataParallel
from navrl_daemon.rl.learner import Learner
from navrl_daemon.runtime.distributed import World
from navrl_daemon.storage.checkpoint import CheckpointDir

log = structlog.get_logger("distributed")


class Ranks:
    """The process groups of a distributed run (see the module docstring)."""

    def __init__(self, world: World, device: torch.device, timeout_s: float) -> None:
        self.world = world
        timeout = timedelta(seconds=timeout_s)
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            dist.init_process_group(
                backend,
                init_method="env://",
                rank=world.rank,
                world_size=world.world_size,
                timeout=timeout,
            )
        self.control = dist.new_group(backend="gloo", timeout=timeout)
        self.learner = dist.new_group(backend="gloo", timeout=timeout)
        self.reducer = DataParallel()
        log.info(
            "joined the distributed run",
            rank=world.rank,
            local_rank=world.local_rank,
            world_size=world.world_size,
            backend=backend,
            device=str(device),
        )

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    # ------------------------------------------------------------------ control (producer)

    async def agree(self, stopping: bool, stage: int) -> tuple[bool, int]:
        """One vote: stop if any rank wants to, and train at the highest curriculum stage
        any rank has reached (only rank 0 evaluates, so only its stage moves; the others
        follow it here, at the same rollout)."""

        def vote() -> tuple[bool, int]:
            votes = torch.tensor([int(stopping), stage])
            dist.all_reduce(votes, op=dist.ReduceOp.MAX, group=self.control)
            return bool(votes[0]), int(votes[1])

        return await anyio.to_thread.run_sync(vote)

    async def sum_episodes(
        self, sums_count: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The finished-episode stat sums of every rank's envs (CPU tensors)."""
        sums, count = sums_count

        def reduce() -> tuple[torch.Tensor, torch.Tensor]:
            both = torch.cat([sums.double().cpu().reshape(-1), count.double().cpu().reshape(1)])
            dist.all_reduce(both, op=dist.ReduceOp.SUM, group=self.control)
            return both[:-1].to(sums.dtype), both[-1].to(count.dtype).reshape(count.shape)

        return await anyio.to_thread.run_sync(reduce)

    async def gather_collectors(self, state: dict[str, Any] | None) -> dict[str, Any] | None:
        """Every rank's collector state onto rank 0, as rank 0's with the others under
        `peers` (rank order) and `world_size`; None on the other ranks, or when a rank's
        env cannot save its state."""
        return await anyio.to_thread.run_sync(self._gather_collectors, state)

    def _gather_collectors(self, state: dict[str, Any] | None) -> dict[str, Any] | None:
        gathered: list[Any] | None = [None] * self.world.world_size if self.world.leader else None
        dist.gather_object(state, gathered, dst=0, group=self.control)
        if gathered is None or any(s is None for s in gathered):
            return None
        return {**gathered[0], "peers": gathered[1:], "world_size": self.world.world_size}

    # ------------------------------------------------------------------ start-up (wiring)

    def newest_checkpoint(self, checkpoints: CheckpointDir) -> Found | None:
        """Rank 0 reads the newest valid checkpoint (pipeline/resume.py); every rank gets
        rank 0's choice, or its DataError."""
        found, error = None, None
        if self.world.leader:
            try:
                found = resume.newest_checkpoint(checkpoints)
            except DataError as err:
                error = err
        payload = [(found, str(error) if error else None)]
        dist.broadcast_object_list(payload, src=0, group=self.control)
        found, message = payload[0]
        if message is not None:
            raise DataError(message)
        return found

    def share_weights(self, policy: torch.nn.Module) -> None:
        self.reducer.broadcast_module(policy)  # rank 0's weights, whatever each loaded

    # ------------------------------------------------------------------ learner (trainer)

    def rollback(self, checkpoints: CheckpointDir, learner: Learner) -> Path:
        """Rank 0 loads its newest checkpoint's learner state and every other rank gets
        the same state (or rank 0's error) from it."""
        if self.world.leader:
            try:
                path = resume.load_learner(checkpoints, learner)
            except Exception as err:
                self._share_learner_state(None, str(err))
                raise
            self._share_learner_state((str(path), learner.state_dict()), None)
            return path
        path_name, state = self._share_learner_state(None, None)
        learner.load_state_dict(state, counters=False)
        return Path(path_name)

    def _share_learner_state(self, state: Any, error: str | None) -> Any:
        payload = [(state, error)]
        dist.broadcast_object_list(payload, src=0, group=self.learner)
        state, message = payload[0]
        if message is not None:
            raise RuntimeError(message)
        return state
