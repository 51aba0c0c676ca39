"""RolloutProducer as a stage: a fake collector, real channels, leases and compute thread.

What it promises (stages/producer.py): rollout i is collected with weights of version at
least i − max_policy_lag; the rollouts whose update is checkpointed carry the collector's
state right after them; every archive.interval-th goes to the archiver too; it stops
where the ranks agree, gathers the final state, and closes its outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest
import structlog
import torch

from navrl_daemon.pipeline.cadence import Cadence, Position
from navrl_daemon.pipeline.coordinator import Coordinator, SingleProcess
from navrl_daemon.pipeline.messages import FinalCollectorState, PolicyWeights, Rollout
from navrl_daemon.runtime.channels import Channel, Overflow
from navrl_daemon.runtime.compute import ComputeThread
from navrl_daemon.runtime.leases import Lease, LeasePool
from navrl_daemon.runtime.supervisor import Shutdown
from navrl_daemon.stages.producer import NoCurriculum, ProducerContext, RolloutProducer
from tests.stages.fakes import FakeCollector, VotingCoordinator, rollout_buffer, run_state

FRAMES = 32  # per rollout


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Run:
    """A producer over `rollouts` rollouts, and a fake trainer publishing version i + 1
    (weight i + 1) once it has read rollout i."""

    def __init__(
        self,
        rollouts: int,
        *,
        lag: int = 0,
        checkpoint: int = 0,
        archive: int = 0,
        coordinator: Coordinator | None = None,
        start: Position | None = None,
        on_rollout: Callable[[Run], None] = lambda run: None,
    ) -> None:
        self.collector = FakeCollector()
        self.pool = LeasePool([rollout_buffer() for _ in range(2)])
        self.to_trainer: Channel[Rollout] = Channel("rollouts", 2, Overflow.BLOCK)
        self.weights: Channel[PolicyWeights] = Channel("weights", 1, Overflow.COALESCE)
        self.archive: Channel[Lease] | None = Channel("archive", 8) if archive else None
        self.final: Channel[FinalCollectorState] = Channel("final collector state", 1)
        self.compute = ComputeThread("test")
        self.shutdown = Shutdown()
        self.coordinator = coordinator or SingleProcess()
        self.producer = RolloutProducer(
            self.collector,
            self.pool,
            self.to_trainer.sender(),
            self.weights.receiver(),
            context=ProducerContext(
                cadence=Cadence(
                    FRAMES,
                    rollouts * FRAMES,
                    max_policy_lag=lag,
                    checkpoint_interval=checkpoint,
                    archive_interval=archive,
                ),
                start=start or Position(),
                coordinator=self.coordinator,
                curriculum=NoCurriculum(),
                shutdown=self.shutdown,
                compute=self.compute,
                state=run_state(collector=self.collector),
            ),
            archive=self.archive.sender() if self.archive else None,
            final_state=self.final.sender(),
        )
        self.received: list[Rollout] = []
        self.collected_with: list[float] = []  # the weight each rollout was collected with
        self.archived: list[int] = []
        self.on_rollout = on_rollout  # after the trainer read a rollout, before it publishes

    async def trainer(self) -> None:
        async with self.weights.sender() as weights:
            async for rollout in self.to_trainer.receiver():
                with rollout.lease:
                    self.collected_with.append(float(rollout.lease.buffer["weight"][0]))
                self.received.append(rollout)
                self.on_rollout(self)
                version = rollout.iteration + 1
                weight = torch.full((1, 1), float(version))
                await weights.send(PolicyWeights(version, 0, {"weight": weight}))

    async def archiver(self) -> None:
        assert self.archive is not None
        async for lease in self.archive.receiver():
            with lease:
                self.archived.append(lease.meta["iteration"])

    def go(self) -> None:
        async def main() -> None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.producer.run)
                tg.start_soon(self.trainer)
                if self.archive is not None:
                    tg.start_soon(self.archiver)

        try:
            anyio.run(main)
        finally:
            self.compute.close()

    def final_state(self) -> dict[str, Any] | None:
        """The state the producer sent when it stopped, for the final checkpoint."""
        return anyio.run(self.final.receiver().receive).state


def test_each_rollout_goes_on_with_its_versions_and_the_state_of_checkpointed_updates() -> None:
    run = Run(6, checkpoint=2, archive=3)
    run.go()
    assert [r.iteration for r in run.received] == [0, 1, 2, 3, 4, 5]
    # Updates 2, 4, 6 are checkpointed: they train on rollouts 1, 3, 5, whose state is
    # the collector's right after them (the env had collected i + 1 rollouts).
    states = {r.iteration: r.collector_state for r in run.received if r.collector_state}
    assert sorted(states) == [1, 3, 5]
    assert all(int(s["env"]["rollouts"]) == i + 1 for i, s in states.items())
    assert run.archived == [0, 3]
    assert int(run.final_state()["env"]["rollouts"]) == 6  # type: ignore[index]
    assert run.pool.free == run.pool.size  # every lease came back
    assert run.producer.frames == 6 * FRAMES


@pytest.mark.parametrize("lag", [0, 1])
def test_rollout_i_is_collected_with_weights_of_version_at_least_i_minus_the_lag(lag) -> None:
    run = Run(5, lag=lag)
    run.go()
    versions = [r.policy_version for r in run.received]
    assert all(v >= r.iteration - lag for v, r in zip(versions, run.received, strict=True))
    assert run.collected_with == [float(v) for v in versions]  # the weights it says it used
    if lag == 0:
        assert versions == [0, 1, 2, 3, 4]


def test_it_stops_where_the_ranks_agree_and_gathers_the_final_state_once() -> None:
    """Another rank votes to stop at the 6th vote (two votes a rollout: before waiting
    for weights, and again once a buffer is free, which this one is): two rollouts."""
    coordinator = VotingCoordinator(stop_at_vote=6)
    run = Run(10, checkpoint=1, coordinator=coordinator)
    run.go()
    assert [r.iteration for r in run.received] == [0, 1]
    assert run.pool.free == run.pool.size  # the buffer taken before the vote went back
    # One state per checkpointed rollout, then the final one, each through the coordinator.
    assert [int(s["env"]["rollouts"]) for s in coordinator.gathered] == [1, 2, 2]
    assert run.final_state() is coordinator.gathered[-1]


def test_a_stop_request_ends_it_before_the_next_rollout_with_the_final_state() -> None:
    run = Run(10, on_rollout=lambda run: run.shutdown.request("test", 10))
    run.go()
    assert [r.iteration for r in run.received] == [0]
    assert int(run.final_state()["env"]["rollouts"]) == 1  # type: ignore[index]
    assert run.pool.free == run.pool.size


def test_a_resumed_run_counts_on_from_its_start() -> None:
    run = Run(5, start=Position(iteration=3, frames=3 * FRAMES))
    run.go()
    assert [r.iteration for r in run.received] == [3, 4]
    assert [r.policy_version for r in run.received] == [3, 4]


def test_a_failed_rollout_capture_is_logged_once_as_an_error() -> None:
    """A GPU run whose rollout step could not be captured goes on op by op (2026-11-28:
    six learning runs did so on an H200 with only a Python warning on stderr to say so)."""

    def failed(run: Run) -> None:
        run.collector.capture_error = "RuntimeError: Cannot copy between CPU and CUDA tensors"

    run = Run(4, on_rollout=failed)
    with structlog.testing.capture_logs() as logs:
        run.go()
    errors = [e for e in logs if e["log_level"] == "error"]
    assert len(errors) == 1
    assert "collecting op by op" in errors[0]["event"]
    assert errors[0]["error"] == "RuntimeError: Cannot copy between CPU and CUDA tensors"
    assert len(run.received) == 4
