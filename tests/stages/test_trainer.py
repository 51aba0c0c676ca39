"""Trainer as a stage: a fake learner, real channels, leases, staging and compute thread.

What it promises (stages/trainer.py): one update per rollout, the lease back once the
update is done; versioned weights published after each; the evaluator's copy and a
snapshot (with the collector state the rollout carried) on the cadence's iterations; a
final snapshot with the producer's final state; the policy exported at flush.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
import structlog
import torch

from navrl_daemon.pipeline.cadence import Cadence
from navrl_daemon.pipeline.messages import FinalCollectorState, PolicyWeights, Rollout, Snapshot
from navrl_daemon.runtime.channels import Channel
from navrl_daemon.runtime.compute import ComputeThread
from navrl_daemon.runtime.leases import LeasePool
from navrl_daemon.runtime.supervisor import Shutdown
from navrl_daemon.stages.trainer import (
    Checkpointing,
    IterationRecord,
    Trainer,
    TrainerContext,
    TrainerEvents,
)
from navrl_daemon.storage.checkpoint import CheckpointDir, encode_checkpoint
from navrl_daemon.storage.staging import SnapshotStaging
from tests.stages.fakes import FakeLearner, rollout_buffer, run_state

FRAMES = 32


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Run:
    def __init__(
        self,
        rollouts: int,
        *,
        checkpoint: int,
        evaluate: int,
        tmp: Path,
        holding: Callable[[int], Path | None] = lambda iteration: None,
    ) -> None:
        self.rollouts = rollouts
        self.learner = FakeLearner()
        self.pool = LeasePool([rollout_buffer()])
        self.to_trainer: Channel[Rollout] = Channel("rollouts", 1)
        self.weights: Channel[PolicyWeights] = Channel("weights", rollouts + 1)
        self.evaluations: Channel[PolicyWeights] = Channel("evaluations", rollouts + 1)
        self.snapshots: Channel[Snapshot] = Channel("snapshots", rollouts + 1)
        self.compute = ComputeThread("test")
        self.records: list[IterationRecord] = []
        self.final_state = {"env": "after the last rollout"}
        self.final: Channel[FinalCollectorState] = Channel("final collector state", 1)
        self.export = tmp / "export" / "policy.pt"
        self.trainer = Trainer(
            self.learner,  # type: ignore[arg-type]
            self.to_trainer.receiver(),
            [self.weights.sender()],
            context=TrainerContext(
                cadence=Cadence(
                    FRAMES,
                    rollouts * FRAMES,
                    checkpoint_interval=checkpoint,
                    eval_interval=evaluate,
                ),
                shutdown=Shutdown(),
                compute=self.compute,
                state=run_state(learner=self.learner),
                export_path=self.export,
            ),
            evaluations=self.evaluations.sender(),
            checkpoints=Checkpointing(
                self.snapshots.sender(),
                SnapshotStaging(rollouts + 1),
                static={"kind": "test"},
                final_state=self.final.receiver(),
                holding=holding,
            ),
            events=TrainerEvents(on_iteration=self.records.append),
        )

    async def producer(self) -> None:
        async with self.to_trainer.sender() as rollouts:
            for i in range(self.rollouts):
                lease = await self.pool.acquire()  # one buffer: back only after the update
                lease.buffer["rollout"].fill_(i + 1)
                episodes = (torch.zeros(3), torch.zeros(()))
                state = {"env": f"after rollout {i}"}
                await rollouts.send(Rollout(lease, i, max(i - 1, 0), 0.01, episodes, state))
            async with self.final.sender() as final:  # as the producer does when it stops
                await final.send(FinalCollectorState(self.final_state))

    def go(self) -> None:
        async def main() -> None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.trainer.run)
                tg.start_soon(self.producer)
            await self.trainer.flush(math.inf)

        try:
            anyio.run(main)
        finally:
            self.compute.close()

    def drained(self, channel: Channel[Any]) -> list[Any]:
        receiver = channel.receiver()
        out = []
        while True:
            try:
                out.append(receiver.receive_nowait())
            except (anyio.WouldBlock, anyio.EndOfStream):
                return out


def test_one_update_per_rollout_weights_after_each_evaluations_on_the_cadence(tmp_path) -> None:
    run = Run(4, checkpoint=0, evaluate=2, tmp=tmp_path)
    run.go()
    assert run.learner.seen == [1.0, 2.0, 3.0, 4.0]
    published = run.drained(run.weights)
    assert [w.version for w in published] == [1, 2, 3, 4]
    assert [float(w.state["weight"]) for w in published] == [1.0, 3.0, 6.0, 10.0]
    assert [w.version for w in run.drained(run.evaluations)] == [2, 4]
    # Rollout i was collected with version max(i - 1, 0): the lag is the learner's
    # version when it trains on it, minus that.
    assert [(r.iteration, r.frames, r.policy_lag) for r in run.records] == [
        (1, 32, 0),
        (2, 64, 1),
        (3, 96, 1),
        (4, 128, 1),
    ]
    assert run.pool.free == 1


def test_snapshots_pair_the_learner_with_the_collector_state_the_rollout_carried(
    tmp_path,
) -> None:
    run = Run(5, checkpoint=2, evaluate=0, tmp=tmp_path)
    run.go()
    snapshots = run.drained(run.snapshots)
    assert [(s.iteration, s.frames, s.final) for s in snapshots] == [
        (2, 64, False),
        (4, 128, False),
        (5, 160, True),  # at the end: the update after the last checkpoint is not lost
    ]
    for s in snapshots:
        s.staged.ready()
    collectors = [s.staged.state["collector"]["env"] for s in snapshots]
    assert collectors == ["after rollout 1", "after rollout 3", "after the last rollout"]
    assert [s.staged.state["learner"]["version"] for s in snapshots] == [2, 4, 5]
    assert all(s.staged.state["kind"] == "test" for s in snapshots)


def test_flush_exports_the_trained_policy_and_never_an_untrained_one(tmp_path) -> None:
    run = Run(3, checkpoint=0, evaluate=0, tmp=tmp_path)
    run.go()
    exported = torch.load(run.export, weights_only=True)
    assert float(exported["weight"]) == 6.0  # 1 + 2 + 3

    untrained = Run(0, checkpoint=0, evaluate=0, tmp=tmp_path / "new")
    untrained.go()
    assert not untrained.export.exists()


@pytest.mark.parametrize("checkpointed", [True, False])
def test_a_failed_export_says_whether_a_checkpoint_holds_the_policy(
    tmp_path, checkpointed: bool
) -> None:
    """The log said "the final checkpoint holds the policy" even when the final checkpoint
    had failed too (a full disk takes both): it names the file that holds it, or says none
    does."""
    checkpoints = CheckpointDir(tmp_path / "checkpoints")
    run = Run(3, checkpoint=0, evaluate=0, tmp=tmp_path, holding=checkpoints.holding)
    run.export.mkdir(parents=True)  # the export cannot be written
    for iteration in (2, 3) if checkpointed else (2,):  # 3: the final one
        data = encode_checkpoint(
            {"w": torch.zeros(2)}, iteration=iteration, frames=0, policy_version=iteration
        )
        checkpoints.write(data, iteration)
    with structlog.testing.capture_logs() as logs:
        run.go()
    (failed,) = [e for e in logs if e["event"].startswith("policy export failed")]
    assert failed["iteration"] == 3
    if checkpointed:
        assert "holds the same policy" in failed["event"]
        assert failed["checkpoint"] == str(checkpoints.path / "ckpt-000000003.nrc")
    else:
        assert "no checkpoint holds this policy" in failed["event"]
        assert "checkpoint" not in failed and "holds the same" not in failed["event"]


def test_a_failed_update_capture_is_logged_once_as_an_error(tmp_path) -> None:
    """The captured update fell back to `fused` at the first update: one error says so,
    not one per update."""
    run = Run(3, checkpoint=0, evaluate=0, tmp=tmp_path)
    run.learner.capture_error = "RuntimeError: operation not permitted"
    with structlog.testing.capture_logs() as logs:
        run.go()
    errors = [e for e in logs if e["log_level"] == "error"]
    assert len(errors) == 1 and "CUDA graph capture failed" in errors[0]["event"]
    assert errors[0]["error"] == "RuntimeError: operation not permitted"
    assert run.learner.seen == [1.0, 2.0, 3.0]
