"""RolloutProducer: fills leased rollout buffers with the env and an acting policy copy.

Before collecting rollout i it makes sure its weights are at least version
i − `pipeline.max_policy_lag` (0: strict on-policy, as NavRL; 1: collect i+1 while the
trainer trains on i), and it always takes newer weights when they are there. Each rollout
is shared with every consumer; an exhausted lease pool is its backpressure. On stop it
finishes the rollout in flight, hands it on, and closes its outputs.

After each rollout whose update will be checkpointed it also captures the collector's
state (env, running TensorDict, RNGs) into the lease's meta: a checkpoint must pair the
learner after update i with the collector right after rollout i, and only here is that
moment known.

With a curriculum (`env.curriculum`, env/curriculum.py) it also checks, before each
rollout, whether the evaluator has promoted training to another stage; if so it builds
that stage's env and resets it, so the rollout starts fresh episodes there (the episodes
running in the old env are dropped, their stats never counted). The stage travels in
the collector state, so a resumed run trains at the stage it stopped at.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import anyio
import structlog

from navrl_daemon.env.curriculum import Curriculum
from navrl_daemon.rl.snapshot import collector_state
from navrl_daemon.rl.training import Collector
from navrl_daemon.runtime.channels import Receiver, Sender
from navrl_daemon.runtime.compute import ComputeThread
from navrl_daemon.runtime.leases import LeasePool
from navrl_daemon.runtime.supervisor import Shutdown
from navrl_daemon.stages.coordinator import Coordinator
from navrl_daemon.stages.messages import PolicyWeights

log = structlog.get_logger("producer")


class RolloutProducer:
    name = "producer"

    def __init__(
        self,
        collector: Collector,
        pool: LeasePool,
        outputs: Sequence[Sender],
        weights: Receiver[PolicyWeights],
        *,
        max_policy_lag: int,
        frames_per_rollout: int,
        total_frames: int,
        shutdown: Shutdown,
        compute: ComputeThread,
        start_iteration: int = 0,
        start_frames: int = 0,
        checkpoint_interval: int = 0,
        archive: Sender | None = None,
        archive_interval: int = 0,
        curriculum: Curriculum | None = None,
        on_stage: Callable[[int], None] = lambda _: None,
        ranks: Coordinator | None = None,
    ) -> None:
        self.collector = collector
        self.pool = pool
        self.outputs = list(outputs)
        self.weights = weights
        self.max_policy_lag = max_policy_lag
        self.frames_per_rollout = frames_per_rollout
        self.total_frames = total_frames
        self.shutdown = shutdown
        self.iteration = start_iteration
        self.version = start_iteration
        self.frames = start_frames
        self.checkpoint_interval = checkpoint_interval
        self.archive = archive
        self.archive_interval = archive_interval
        self.compute = compute
        self.curriculum = curriculum
        self.on_stage = on_stage
        # A distributed run (pipeline/ranks.py): the ranks vote before every rollout
        # whether to go on, sum their episode stats, and gather their env states to rank 0
        # for checkpoints; `final_state` is that gathered state once the producers stopped.
        self.ranks = ranks
        self.final_state: dict[str, Any] | None = None
        self._agreed_stage: int | None = None  # the curriculum stage the ranks voted for

    async def run(self) -> None:
        agreed_end = False  # every rank ends here together: out of frames, or it voted so
        try:
            while (self.ranks is not None or not self.shutdown.stopping) and self._frames_left():
                if not await self._catch_up():
                    break  # the trainer has gone: nothing more to collect for
                lease = await self.pool.acquire()
                if await self._stop_now():  # the wait for a free buffer may have been long
                    lease.release()
                    agreed_end = True
                    break
                if self.curriculum is not None:
                    await self._follow_curriculum(self.curriculum)
                lease.meta.update(iteration=self.iteration, policy_version=self.version)
                structlog.contextvars.bind_contextvars(
                    iteration=self.iteration, policy_version=self.version
                )
                log.debug("collecting")
                try:
                    seconds, state = await self.compute.run(self._collect, lease.buffer)
                except BaseException:
                    lease.release()
                    raise
                lease.meta["collect_s"] = seconds
                if self.ranks is not None and self._checkpoint_due():
                    state = await anyio.to_thread.run_sync(self.ranks.gather_collectors, state)
                if state is not None:
                    lease.meta["collector_state"] = state
                episodes = self.collector.episodes.take_sums()
                if self.ranks is not None:
                    episodes = await anyio.to_thread.run_sync(self.ranks.sum_episodes, episodes)
                lease.meta["episodes"] = episodes
                targets = [*self.outputs, *self._archive_if_due()]
                for out, handle in zip(targets, lease.share(len(targets)), strict=True):
                    await out.send(handle)
                self.iteration += 1
                self.frames += self.frames_per_rollout
            else:
                agreed_end = True
            if self.ranks is not None and agreed_end:
                await self._gather_final_state()
        finally:
            for out in [*self.outputs, *([self.archive] if self.archive else [])]:
                out.close()  # receivers drain what was sent, then end

    def _archive_if_due(self) -> list[Sender]:
        due = self.archive_interval and self.iteration % self.archive_interval == 0
        return [self.archive] if self.archive is not None and due else []

    def _collect(self, buffer: object) -> tuple[float, dict | None]:
        seconds = self.collector.collect(buffer)  # type: ignore[arg-type]
        return seconds, self.collector_state() if self._checkpoint_due() else None

    def _checkpoint_due(self) -> bool:
        """Whether the update on the rollout being collected will be checkpointed."""
        interval = self.checkpoint_interval
        return bool(interval) and (self.iteration + 1) % interval == 0

    async def _stop_now(self) -> bool:
        """Whether to stop before this rollout; in a distributed run, whether any rank
        wants to, so every rank stops after the same rollout."""
        if self.ranks is None:
            return self.shutdown.stopping
        mine = self.curriculum.stage if self.curriculum is not None else 0
        stop, stage = await anyio.to_thread.run_sync(self.ranks.agree, self.shutdown.stopping, mine)
        self._agreed_stage = stage
        if self.curriculum is not None:
            self.curriculum.follow(stage)
        return stop

    async def _gather_final_state(self) -> None:
        """Every rank's collector state after its last rollout, onto rank 0 (the final
        checkpoint). Reached by every rank together: they stopped at the same rollout."""
        state = await self.compute.run(self.collector_state)
        assert self.ranks is not None
        self.final_state = await anyio.to_thread.run_sync(self.ranks.gather_collectors, state)

    def collector_state(self) -> dict[str, Any] | None:
        """The collector's state for a checkpoint, with the curriculum's progress."""
        state = collector_state(self.collector)
        if state is not None and self.curriculum is not None:
            state["curriculum"] = self.curriculum.state_dict()
        return state

    async def _follow_curriculum(self, curriculum: Curriculum) -> None:
        # In a distributed run every rank applies the stage they voted for at this
        # rollout, not rank 0's newest (its evaluator may have promoted since the vote).
        stage = curriculum.stage if self._agreed_stage is None else self._agreed_stage
        if stage == curriculum.applied:
            return
        await self.compute.run(use_stage, self.collector, curriculum, stage)
        log.info(
            "curriculum stage applied",
            iteration=self.iteration,  # the first rollout at the new stage
            stage=stage,
            name=curriculum.name(stage),
            env=curriculum.stages[stage].env_overrides(),
        )
        self.on_stage(stage)

    def _frames_left(self) -> bool:
        return self.frames < self.total_frames

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
        while (newest.version if newest else self.version) < self.iteration - self.max_policy_lag:
            try:
                newest = await self.weights.receive()
            except anyio.EndOfStream:
                return False
        if newest is not None and newest.version != self.version:
            await self.compute.run(self.collector.policy.load_state_dict, newest.state)
            self.version = newest.version
        return True

    async def flush(self, deadline: float) -> None:
        """Nothing of its own to persist: rollouts in flight belong to their consumers."""


def use_stage(collector: Collector, curriculum: Curriculum, stage: int) -> None:
    """Put the collector on a fresh, reset env of curriculum `stage`."""
    env = curriculum.build_env(stage, device=collector.env.device, seed=collector.cfg.run.seed)
    collector.env, collector.td = env, env.reset()
    curriculum.applied = stage
