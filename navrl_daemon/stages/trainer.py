"""Trainer: PPO-updates on each leased rollout, then publishes versioned weights.

The update runs on a compute thread (the event loop only moves leases); the lease is
released the moment the update is done, so the producer can refill that buffer. When the
rollout channel ends (the producer stopped) the trainer has trained on every rollout it
was handed; its flush exports the final policy in NavRL's layout.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio
import structlog
import torch

from navrl_daemon.rl.training import Learner
from navrl_daemon.runtime.channels import Receiver, Sender
from navrl_daemon.runtime.compute import ComputeThread
from navrl_daemon.runtime.leases import Lease
from navrl_daemon.runtime.supervisor import Shutdown
from navrl_daemon.stages.messages import PolicyWeights
from navrl_daemon.storage.policy_file import save_policy_state

log = structlog.get_logger("trainer")


@dataclass(frozen=True)
class IterationRecord:
    # The policy version after this iteration's update: one update per iteration.
    iteration: int
    frames: int
    policy_lag: int
    collect_s: float
    update_s: float
    losses: dict[str, float]
    episodes: tuple[torch.Tensor, torch.Tensor]


class Trainer:
    name = "trainer"

    def __init__(
        self,
        learner: Learner,
        rollouts: Receiver[Lease],
        weights: Sequence[Sender[PolicyWeights]],
        *,
        frames_per_iteration: int,
        shutdown: Shutdown,
        compute: ComputeThread,
        export_path: Path,
        on_iteration: Callable[[IterationRecord], None] = lambda _: None,
        evaluations: Sender[PolicyWeights] | None = None,
        eval_interval: int = 0,
        start_frames: int = 0,
    ) -> None:
        self.learner = learner
        self.rollouts = rollouts
        self.weights = list(weights)
        self.evaluations = evaluations
        self.eval_interval = eval_interval
        self.frames_per_iteration = frames_per_iteration
        self.frames = start_frames
        self.shutdown = shutdown
        self.export_path = export_path
        self.on_iteration = on_iteration
        # Held while the weights change, so a flush never reads a half-stepped policy.
        self._weights_lock = threading.Lock()
        self.compute = compute

    async def run(self) -> None:
        try:
            async for lease in self.rollouts:
                with lease:
                    record = await self._train_on(lease)
                await self._publish()
                self.on_iteration(record)
        finally:
            for out in [*self.weights, self.evaluations]:
                if out is not None:
                    out.close()

    async def _train_on(self, lease: Lease) -> IterationRecord:
        lag = self.learner.version - lease.meta["policy_version"]
        structlog.contextvars.bind_contextvars(
            iteration=lease.meta["iteration"], policy_version=self.learner.version
        )
        log.debug("updating", policy_lag=lag)
        t0 = time.perf_counter()
        losses = await self.compute.run(self._update, lease.buffer)
        self.frames += self.frames_per_iteration
        return IterationRecord(
            iteration=self.learner.version,
            frames=self.frames,
            policy_lag=lag,
            collect_s=lease.meta["collect_s"],
            update_s=time.perf_counter() - t0,
            losses=losses,
            episodes=lease.meta["episodes"],
        )

    def _update(self, buffer: object) -> dict[str, float]:
        with self._weights_lock:
            return self.learner.update(buffer, abort=self.shutdown.abort)  # type: ignore[arg-type]

    async def _publish(self) -> None:
        version = self.learner.version
        weights = PolicyWeights(version, self.frames, await self._run_locked(self.learner.weights))
        for out in self.weights:
            await out.send(weights)
        due = self.eval_interval and version % self.eval_interval == 0
        if self.evaluations is not None and due:
            await self.evaluations.send(weights)

    async def _run_locked(self, fn: Callable[[], object]) -> object:
        def locked() -> object:
            with self._weights_lock:
                return fn()

        return await self.compute.run(locked)

    async def flush(self, deadline: float) -> None:
        if self.learner.version == 0:
            log.info("nothing trained: policy not exported", path=str(self.export_path))
            return  # never replace an earlier run's export with untrained weights
        state = await self._run_locked(self.learner.policy.state_dict)
        await anyio.to_thread.run_sync(save_policy_state, self.export_path, state)
        log.info(
            "policy exported",
            path=str(self.export_path),
            iteration=self.learner.version,
            frames=self.frames,
        )
