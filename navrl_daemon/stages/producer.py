"""RolloutProducer: fills leased rollout buffers with the env and an acting policy copy.

Before collecting rollout i it makes sure its weights are at least version
i − `pipeline.max_policy_lag` (0: strict on-policy, as NavRL; 1: collect i+1 while the
trainer trains on i), and it always takes newer weights when they are there. Each rollout
goes to the trainer, and every `archive.interval`-th to the archiver too (the lease is
shared between them); an exhausted lease pool is its backpressure. On stop it finishes
the rollout in flight, hands it on, and closes its outputs.

After each rollout whose update will be checkpointed (pipeline/cadence.py) it also captures
the collector's state (env, running TensorDict, RNGs) into the rollout it hands on: a
checkpoint must pair the learner after update i with the collector right after rollout i,
and only here is that moment known. When it stops, it sends the collector's final state
to the trainer (`FinalCollectorState`) for the final checkpoint.

Before each rollout the ranks agree (pipeline/coordinator.py; alone, the process agrees
with itself) whether to stop and at which curriculum stage to train, so every rank stops
after the same rollout and changes stage at the same one. The stage this process votes
for is its evaluator's newest decision, which reaches the producer only as a message
(`CurriculumProgress`, taken between rollouts); `CurriculumFollower` puts the training
env at the agreed stage (rl/curriculum.py: `use_stage`). Without a curriculum the
producer has a `NoCurriculum`, which votes for stage 0 and does nothing.

With `pipeline.trainer_stream` (CUDA) the trainer runs on a stream of its own: the
producer then marks each rollout's end with an event on its stream (`Rollout.ready`) for
the trainer to wait on, and tells the allocator that the weights it loads (the trainer's
tensors) are read on its stream (runtime/streams.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import anyio
import structlog
import torch

from navrl_daemon.ops.logging import FirstError
from navrl_daemon.pipeline.cadence import Cadence, Position
from navrl_daemon.pipeline.coordinator import Coordinator
from navrl_daemon.pipeline.messages import (
    CurriculumProgress,
    FinalCollectorState,
    PolicyWeights,
    Rollout,
)
from navrl_daemon.rl.collector import Collector
from navrl_daemon.rl.curriculum import Curriculum, use_stage
from navrl_daemon.rl.run_state import COLLECTOR, RunState
from navrl_daemon.runtime.channels import Receiver, Sender
from navrl_daemon.runtime.compute import ComputeThread
from navrl_daemon.runtime.leases import Lease, LeasePool
from navrl_daemon.runtime.streams import TrainerStream
from navrl_daemon.runtime.supervisor import Shutdown

log = structlog.get_logger("producer")
curriculum_log = structlog.get_logger("curriculum")


class Collected(NamedTuple):
    """What the compute thread returns after a rollout."""

    seconds: float
    collector_state: dict[str, Any] | None  # when the update on it is checkpointed
    ready: torch.cuda.Event | None  # with the trainer's own stream: the rollout's end
    # With density levels: envs per level, and per level [episodes ended, reached,
    # collided] during the rollout.
    levels: tuple[list[float], list[list[float]]] | None


@dataclass(frozen=True)
class ProducerContext:
    """What the producer runs with besides its inputs and outputs."""

    cadence: Cadence
    start: Position
    coordinator: Coordinator
    curriculum: CurriculumFollower | NoCurriculum
    shutdown: Shutdown
    compute: ComputeThread
    # The run's stateful parts: the producer captures the collector's half of them.
    state: RunState
    # The trainer's CUDA stream of its own, if it has one: rollouts are handed over on it.
    trainer_stream: TrainerStream = field(default_factory=TrainerStream)


@dataclass(frozen=True)
class ProducerEvents:
    """What the producer reports as it goes (telemetry)."""

    # With env.navigation.map_levels: told after every rollout the share of envs at each level and
    # per level [episodes ended, reached, collided] during it (None: not measured).
    on_levels: Callable[[list[float], list[list[float]]], None] | None = None
    # ("collect", True) when a rollout starts, ("collect", False) when it ends.
    on_phase: Callable[[str, bool], None] = lambda _name, _running: None


class RolloutProducer:
    name = "producer"

    def __init__(
        self,
        collector: Collector,
        pool: LeasePool,
        rollouts: Sender[Rollout],
        weights: Receiver[PolicyWeights],
        *,
        context: ProducerContext,
        archive: Sender[Lease] | None = None,
        # The process that owns the state dir: where the final state goes (the trainer).
        final_state: Sender[FinalCollectorState] | None = None,
        events: ProducerEvents | None = None,
    ) -> None:
        events = events or ProducerEvents()
        self.collector = collector
        self.on_levels = events.on_levels
        self.on_phase = events.on_phase
        self.trainer_stream = context.trainer_stream
        self.pool = pool
        self.rollouts = rollouts
        self.weights = weights
        self.cadence = context.cadence
        self.iteration = context.start.iteration
        self.version = context.start.iteration
        self.frames = context.start.frames
        self.coordinator = context.coordinator
        self.curriculum = context.curriculum
        self.archive = archive
        self.final_state = final_state
        self.shutdown = context.shutdown
        self.compute = context.compute
        self.state = context.state
        # Once a rollout capture failed (`env.collect_path = auto`), every rollout is
        # collected op by op: the same rollouts, several times slower on a GPU.
        self._capture_failure = FirstError(
            log,
            "CUDA graph capture of the rollout step failed: collecting op by op "
            "(the same rollouts, several times slower)",
        )

    async def run(self) -> None:
        try:
            while self.cadence.frames_left(self.frames):
                if await self._agree_to_stop():
                    break
                if not await self._catch_up():
                    return  # the trainer has gone: nothing more to collect for
                lease = await self.pool.acquire()
                if await self._agree_to_stop():  # the wait for a free buffer may have been long
                    lease.release()
                    break
                await self._collect_and_send(lease)
            # Every rank ends here together: out of frames, or one of them voted so.
            self.curriculum.take_decisions()  # the final state counts every one so far
            state = await self.compute.run(self.collector_state)
            gathered = await self.coordinator.gather_collectors(state)
            if self.final_state is not None:
                await self.final_state.send(FinalCollectorState(gathered))
        finally:
            self.rollouts.close()  # receivers drain what was sent, then end
            for out in (self.archive, self.final_state):
                if out is not None:
                    out.close()

    async def _collect_and_send(self, lease: Lease) -> None:
        await self.curriculum.before_rollout(self.iteration)
        # The archiver reads these (stages/archiver.py).
        lease.meta.update(iteration=self.iteration, policy_version=self.version)
        # Iteration N, as every line counts it: the one whose update makes policy version N.
        structlog.contextvars.bind_contextvars(
            iteration=self.iteration + 1, policy_version=self.version
        )
        log.debug("collecting")
        checkpointed = self.cadence.checkpoints(self.iteration + 1)
        if checkpointed:  # the state captured after it counts every decision so far
            self.curriculum.take_decisions()
        try:
            collected = await self.compute.run(self._collect, lease.buffer, checkpointed)
        except BaseException:
            lease.release()
            raise
        seconds, state, ready, levels = collected
        self._capture_failure.check(self.collector.capture_error)
        if self.on_levels is not None and levels is not None:
            self.on_levels(*levels)
        if checkpointed:
            state = await self.coordinator.gather_collectors(state)
        episodes = await self.coordinator.sum_episodes(self.collector.episodes.take_sums())
        archived = self.archive is not None and self.cadence.archives(self.iteration)
        trainer_lease, *archive_lease = lease.share(2 if archived else 1)
        await self.rollouts.send(
            Rollout(trainer_lease, self.iteration, self.version, seconds, episodes, state, ready)
        )
        if archive_lease:
            assert self.archive is not None
            await self.archive.send(archive_lease[0])
        self.iteration += 1
        self.frames += self.cadence.frames_per_iteration

    def _levels(self) -> tuple[list[float], list[list[float]]]:
        env = self.collector.env
        return env.level_shares(), env.level_outcomes()

    def _collect(self, buffer: object, checkpointed: bool) -> Collected:
        self.on_phase("collect", True)
        try:
            seconds = self.collector.collect(buffer)  # type: ignore[arg-type]
        finally:
            self.on_phase("collect", False)
        return Collected(
            seconds,
            self.collector_state() if checkpointed else None,
            self.trainer_stream.mark_end(),
            self._levels() if self.on_levels is not None else None,
        )

    async def _agree_to_stop(self) -> bool:
        """Whether to stop before this rollout: whether any rank wants to, so every rank
        stops after the same rollout; the ranks also agree on the curriculum stage."""
        wanted = self.curriculum.wanted()
        stop, stage = await self.coordinator.agree(self.shutdown.stopping, wanted)
        self.curriculum.agreed(stage)
        return stop

    def collector_state(self) -> dict[str, Any] | None:
        """The collector's half of the run's state (env, RNGs, curriculum progress)."""
        return self.state.capture(COLLECTOR)

    async def _catch_up(self) -> bool:
        """Load the newest weights; wait while ours are older than the lag allows."""
        newest: PolicyWeights | None = None
        while True:
            try:
                newest = self.weights.receive_nowait()
            except anyio.WouldBlock:
                break
            except anyio.EndOfStream:
                if newest is None:
                    return False
                break
        oldest_allowed = self.iteration - self.cadence.max_policy_lag
        while (newest.version if newest else self.version) < oldest_allowed:
            try:
                newest = await self.weights.receive()
            except anyio.EndOfStream:
                return False
        if newest is not None and newest.version != self.version:
            await self.compute.run(self._load, newest.state)
            self.version = newest.version
        return True

    def _load(self, state: dict[str, torch.Tensor]) -> None:
        self.collector.policy.load_state_dict(state)
        self.trainer_stream.read_here(state.values())  # by copies still queued here

    async def flush(self, deadline: float) -> None:
        """Nothing of its own to persist: rollouts in flight belong to their consumers."""


class CurriculumFollower:
    """The producer's curriculum: it takes the evaluator's decisions from their channel
    (none on a rank without an evaluator), and before each rollout puts the collector on
    the stage the ranks agreed on, if it is not on it already. A new stage's env starts
    fresh episodes (those in flight are dropped, their stats never counted); with
    `env.stage_switch = "episodes"` (and stages that differ only in per-episode keys) it
    takes over the old env's state instead, and the episodes in flight finish."""

    def __init__(
        self,
        curriculum: Curriculum,
        collector: Collector,
        compute: ComputeThread,
        decisions: Receiver[CurriculumProgress] | None = None,
        on_stage: Callable[[int], None] = lambda _: None,
    ) -> None:
        self.curriculum = curriculum
        self.collector = collector
        self.compute = compute
        self.decisions = decisions
        self.on_stage = on_stage  # the training env is now at this stage
        self._agreed: int | None = None

    def wanted(self) -> int:
        """The stage this process wants training at: its evaluator's newest decision."""
        self.take_decisions()
        return self.curriculum.stage

    def take_decisions(self) -> None:
        """Take the evaluator's newest progress, if one is waiting."""
        while self.decisions is not None:
            try:
                message = self.decisions.receive_nowait()
            except anyio.WouldBlock:
                break
            except anyio.EndOfStream:  # the evaluator has stopped: no more decisions
                self.decisions = None
                break
            self.curriculum.received(message.progress)

    def agreed(self, stage: int) -> None:
        """The ranks agreed to train at `stage` from the next rollout on (never back)."""
        self.curriculum.follow(stage)
        self._agreed = stage

    async def before_rollout(self, iteration: int) -> None:
        """Put the collector on the agreed stage's env, if it is not on it already."""
        curriculum = self.curriculum
        # Every rank applies the stage they voted for at this rollout, not its own newest
        # (rank 0's evaluator may have promoted since the vote).
        stage = curriculum.stage if self._agreed is None else self._agreed
        if stage == curriculum.applied:
            return
        carry = curriculum.carries_episodes(curriculum.applied, stage)
        carried = await self.compute.run(use_stage, self.collector, curriculum, stage, carry)
        curriculum_log.info(
            "curriculum stage applied",
            iteration=iteration,  # the first rollout at the new stage
            stage=stage,
            name=curriculum.name(stage),
            env=curriculum.stages[stage].env_overrides(),
            episodes="carried" if carried else "reset",
        )
        self.on_stage(stage)


class NoCurriculum:
    """The follower of a run without a curriculum: one env, stage 0, nothing to keep."""

    def wanted(self) -> int:
        return 0

    def take_decisions(self) -> None:
        pass

    def agreed(self, stage: int) -> None:
        pass

    async def before_rollout(self, iteration: int) -> None:
        pass
