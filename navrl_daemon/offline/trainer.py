"""The trainer of the offline objectives: behaviour cloning from prefetched batches.

- `OfflineTrainer` (`offline.objective = "bc"`): takes the HDF5Prefetcher's batch leases,
  one gradient step each (`rl.bc.BCLearner`, on a compute thread), releases the lease when
  the step is done (the slot is read into again only then). It ends after
  `offline.steps` steps (0: never) or when the prefetcher stops (a signal), stages a final
  snapshot for the CheckpointWriter, and its flush exports the policy. The time it waits
  for a batch is the data wait (`navrl_prefetch_wait_seconds`).
- `BCTerm` (`"ppo+bc"`): the `aux_loss` of PPO's update (rl/ppo.py). Called on the
  trainer's compute thread once per minibatch, it takes the next prefetched batch from
  the event loop and returns `{"bc_loss": bc_coef * Beta NLL}`.
- `TrainerWithBCTerm`: the PPO Trainer stage with its BCTerm: the term learns the event
  loop when the stage starts, and its batch channel closes when the trainer ends, which
  ends the prefetcher.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import structlog
import torch
from tensordict import TensorDictBase

from navrl_daemon.offline.bc import ACTION_KEY, BCLearner, beta_bc_loss
from navrl_daemon.pipeline.cadence import Cadence
from navrl_daemon.pipeline.export import export_policy
from navrl_daemon.pipeline.messages import PolicyWeights, Snapshot
from navrl_daemon.rl.policy import NavRLPolicy
from navrl_daemon.runtime.channels import Receiver, Sender
from navrl_daemon.runtime.compute import ComputeThread
from navrl_daemon.runtime.leases import Lease
from navrl_daemon.runtime.supervisor import Shutdown
from navrl_daemon.stages.trainer import Checkpointing, Trainer

log = structlog.get_logger("trainer")


@dataclass(frozen=True)
class StepRecord:
    step: int  # steps taken so far, this one included
    samples: int  # transitions trained on so far (steps x batch size)
    step_s: float
    wait_s: float  # waiting for the batch: the data wait
    stats: dict[str, float]  # bc_loss, grad_norm, skipped


@dataclass(frozen=True)
class OfflineTrainerContext:
    """What the offline trainer runs with besides its inputs and outputs."""

    cadence: Cadence  # which steps evaluate and checkpoint
    shutdown: Shutdown
    compute: ComputeThread
    export_path: Path
    steps: int  # `offline.steps` (0: until a signal)
    batch_size: int


@dataclass(frozen=True)
class OfflineTrainerEvents:
    """What the offline trainer reports as it goes (telemetry)."""

    on_step: Callable[[StepRecord], None] = lambda _: None
    on_end: Callable[[], None] = lambda: None  # after the last step (a last, partial window)
    on_export_failed: Callable[[], None] = lambda: None


class OfflineTrainer:
    name = "trainer"

    def __init__(
        self,
        learner: BCLearner,
        batches: Receiver[Lease[int]],
        *,
        context: OfflineTrainerContext,
        evaluations: Sender[PolicyWeights] | None = None,
        checkpoints: Checkpointing | None = None,
        events: OfflineTrainerEvents | None = None,
    ) -> None:
        events = events or OfflineTrainerEvents()
        self.learner = learner
        self.on_export_failed = events.on_export_failed
        self.batches = batches
        self.steps = context.steps
        self.batch_size = context.batch_size
        self.shutdown = context.shutdown
        self.compute = context.compute
        self.export_path = context.export_path
        self.on_step = events.on_step
        self.on_end = events.on_end
        self.cadence = context.cadence
        self.evaluations = evaluations
        self.checkpoints = checkpoints
        if checkpoints is not None:
            checkpoints.last_version = learner.steps  # a resumed run's start is on disk

    @property
    def samples(self) -> int:
        return self.learner.steps * self.batch_size

    def _done(self) -> bool:
        return self.shutdown.stopping or 0 < self.steps <= self.learner.steps

    async def run(self) -> None:
        ckpt = self.checkpoints
        try:
            while not self._done():
                t0 = time.perf_counter()
                try:
                    lease = await self.batches.receive()
                except anyio.EndOfStream:
                    break  # the prefetcher stopped: shutting down
                t1 = time.perf_counter()
                with lease:
                    stats = await self.compute.run(self._step, lease.meta["batch"])
                step = self.learner.steps
                record = StepRecord(step, self.samples, time.perf_counter() - t1, t1 - t0, stats)
                if self.evaluations is not None and self.cadence.evaluates(step):
                    await self.evaluations.send(await self._weights())
                if ckpt and self.cadence.checkpoints(step):
                    await self._snapshot(final=False)
                self.on_step(record)
            self.on_end()
            if ckpt and ckpt.last_version != self.learner.steps:
                await self._snapshot(final=True)
        finally:
            self.batches.close()  # ends the prefetcher once offline.steps are done
            for out in (self.evaluations, ckpt and ckpt.snapshots):
                if out is not None:
                    out.close()
            if ckpt is not None:  # the last snapshot's copies finish on their own
                ckpt.staging.close(wait=False)

    def _step(self, batch: Any) -> dict[str, float]:
        if self.checkpoints is not None:
            self.checkpoints.staging.fence()  # a snapshot still reading the weights
        return self.learner.step(batch)

    async def _weights(self) -> PolicyWeights:
        def copy() -> dict[str, torch.Tensor]:
            return {k: v.detach().clone() for k, v in self.learner.policy.state_dict().items()}

        return PolicyWeights(self.learner.steps, self.samples, await self.compute.run(copy))

    async def _snapshot(self, *, final: bool) -> None:
        """Stage the learner (the trainer's only stall) and queue the snapshot."""
        ckpt = self.checkpoints
        assert ckpt is not None
        t0 = time.perf_counter()
        staged = await self.compute.run(ckpt.staging.stage, self.learner.state())
        ckpt.on_stall(time.perf_counter() - t0)
        staged.state.update(ckpt.static, frames=self.samples)
        ckpt.last_version = self.learner.steps
        step = self.learner.steps
        await ckpt.snapshots.send(Snapshot(step, self.samples, staged, final))

    async def flush(self, deadline: float) -> None:
        if self.learner.steps == 0:
            log.info("nothing trained: policy not exported", path=str(self.export_path))
            return  # never replace an earlier run's export with untrained weights
        state = await self.compute.run(self.learner.policy.state_dict)
        holding = self.checkpoints.holding if self.checkpoints else lambda iteration: None
        await export_policy(
            self.export_path,
            state,
            on_failed=self.on_export_failed,
            checkpoint=lambda: holding(self.learner.steps),
            kind=self.learner.kind,
            steps=self.learner.steps,
            samples=self.samples,
        )


class BCTerm:
    """`aux_loss` for PPO's update: `bc_coef` x the Beta NLL of the next prefetched
    rollout-archive batch. Runs on the compute thread; waits for the batch on the event
    loop (`token`, set by TrainerWithBCTerm). Once the prefetcher has stopped (shutdown)
    the update in flight finishes on the last batch it got."""

    def __init__(
        self,
        batches: Receiver[Lease[int]],
        *,
        coef: float,
        device: torch.device,
        on_wait: Callable[[float], None] = lambda _: None,
    ) -> None:
        self.batches = batches
        self.coef = coef
        self.device = device
        self.on_wait = on_wait
        self.token: Any = None
        self.batches_used = 0
        self._last: TensorDictBase | None = None

    async def _take(self) -> TensorDictBase | None:
        try:
            lease = await self.batches.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            return None
        # Archive batches are owned TensorDicts, not views of a slot: the slot can go back
        # before the batch is used.
        with lease:
            return lease.meta["batch"]

    def __call__(self, policy: NavRLPolicy, minibatch: TensorDictBase) -> dict[str, torch.Tensor]:
        t0 = time.perf_counter()
        batch = anyio.from_thread.run(self._take, token=self.token)
        if batch is not None:
            self.on_wait(time.perf_counter() - t0)
            self._last = batch.to(self.device, non_blocking=True)
            self.batches_used += 1
        if self._last is None:  # no batch ever came: the term is there, and 0
            return {"bc_loss": torch.zeros((), device=self.device)}
        return {"bc_loss": self.coef * beta_bc_loss(policy, self._last, ACTION_KEY)}

    def close(self) -> None:
        self.batches.close()


class TrainerWithBCTerm:
    """The PPO Trainer, whose learner was built with `term` as its `aux_loss` (see the
    module docstring)."""

    name = "trainer"

    def __init__(self, trainer: Trainer, term: BCTerm) -> None:
        self.trainer = trainer
        self.term = term

    async def run(self) -> None:
        self.term.token = anyio.lowlevel.current_token()
        try:
            await self.trainer.run()
        finally:
            self.term.close()

    async def flush(self, deadline: float) -> None:
        await self.trainer.flush(deadline)
