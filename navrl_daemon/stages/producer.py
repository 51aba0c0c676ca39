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
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import structlog

from navrl_daemon.rl.snapshot import collector_state
from navrl_daemon.rl.training import Collector
from navrl_daemon.runtime.channels import Receiver, Sender
from navrl_daemon.runtime.compute import ComputeThread
from navrl_daemon.runtime.leases import LeasePool
from navrl_daemon.runtime.supervisor import Shutdown
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

    async def run(self) -> None:
        try:
            while not self.shutdown.stopping and self._frames_left():
                if not await self._catch_up():
                    break  # the trainer has gone: nothing more to collect for
                lease = await self.pool.acquire()
                if self.shutdown.stopping:  # the wait for a free buffer may have been long
                    lease.release()
                    break
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
                if state is not None:
                    lease.meta["collector_state"] = state
                lease.meta["episodes"] = self.collector.episodes.take_sums()
                targets = [*self.outputs, *self._archive_if_due()]
                for out, handle in zip(targets, lease.share(len(targets)), strict=True):
                    await out.send(handle)
                self.iteration += 1
                self.frames += self.frames_per_rollout
        finally:
            for out in [*self.outputs, *([self.archive] if self.archive else [])]:
                out.close()  # receivers drain what was sent, then end

    def _archive_if_due(self) -> list[Sender]:
        due = self.archive_interval and self.iteration % self.archive_interval == 0
        return [self.archive] if self.archive is not None and due else []

    def _collect(self, buffer: object) -> tuple[float, dict | None]:
        seconds = self.collector.collect(buffer)  # type: ignore[arg-type]
        due = self.checkpoint_interval and (self.iteration + 1) % self.checkpoint_interval == 0
        return seconds, collector_state(self.collector) if due else None

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
