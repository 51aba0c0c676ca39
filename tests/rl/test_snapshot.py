"""Training state out and back in: the run continues bit for bit; rollback restores it."""

from __future__ import annotations

import copy
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from navrl_daemon.config import load_config
from navrl_daemon.rl.learner import NonFiniteTraining
from navrl_daemon.rl.run_state import training_state
from navrl_daemon.rl.snapshot import restore_rng, rng_state
from navrl_daemon.rl.training import Training
from navrl_daemon.storage.staging import SnapshotStaging
from tests.conftest import TINY, trainer_for


def tiny(*extra: str):
    return load_config(None, [*TINY, *extra], environ={})


def params(training: Training) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in training.policy.state_dict().items()}


def test_rng_state_round_trips_torch_numpy_and_python() -> None:
    saved = rng_state()
    first = (torch.rand(3), np.random.rand(3), random.random())
    restore_rng(copy.deepcopy(saved))
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(first[0], again[0])
    assert np.array_equal(first[1], again[1]) and first[2] == again[2]


def test_restored_training_continues_bit_for_bit() -> None:
    cfg = tiny()
    a = Training.build(cfg, "cpu")
    for _ in range(2):
        a.step()
    learner = copy.deepcopy(a.learner.state_dict())  # references → copies, as staging does
    collector = a.collector.state_dict()  # already copies
    for _ in range(2):
        a.step()
    expected = params(a)

    b = Training.build(cfg, "cpu")  # a fresh process would build exactly this
    b.step()  # and has done something else meanwhile
    b.learner.load_state_dict(learner)
    b.collector.load_state_dict(collector)
    assert b.learner.version == 2
    for _ in range(2):
        b.step()
    got = params(b)
    assert all(torch.equal(expected[k], got[k]) for k in expected)


def test_restored_learning_rates_come_from_the_config() -> None:
    a = Training.build(tiny(), "cpu")
    a.step()
    saved = copy.deepcopy(a.learner.state_dict())
    b = Training.build(tiny("ppo.actor_lr=1e-5"), "cpu")
    b.learner.load_state_dict(saved)
    assert b.learner.optimizers["actor"].param_groups[0]["lr"] == 1e-5
    assert b.learner.optimizers["critic"].param_groups[0]["lr"] == 1e-5
    assert b.learner.optimizers["feature_extractor"].param_groups[0]["lr"] == 5e-4


def test_collector_state_of_another_env_layout_is_refused_untouched() -> None:
    a = Training.build(tiny(), "cpu")
    saved = a.collector.state_dict()
    b = Training.build(tiny("env.num_envs=4"), "cpu")
    before = b.collector.td.clone()
    with pytest.raises(ValueError, match="shape"):
        b.collector.load_state_dict(saved)
    assert (b.collector.td == before).all()


def test_trainer_rolls_back_to_the_checkpoint_and_training_goes_on(tmp_path: Path) -> None:
    from navrl_daemon.runtime.channels import Channel
    from navrl_daemon.runtime.compute import ComputeThread
    from navrl_daemon.stages.trainer import Checkpointing
    from navrl_daemon.storage.staging import SnapshotStaging

    training = Training.build(tiny("ppo.max_nonfinite_updates=0"), "cpu")
    training.step()
    good = copy.deepcopy(training.learner.state_dict())
    loaded: list[str] = []

    def rollback(learner) -> Path:
        learner.load_state_dict(good, counters=False)
        loaded.append("ckpt")
        return tmp_path / "ckpt-000000001.nrc"

    compute = ComputeThread()
    trainer = trainer_for(
        training,
        compute,
        Checkpointing(Channel("snapshots", 1).sender(), SnapshotStaging(1), static={}),
        export_path=tmp_path / "policy.pt",
        rollback=rollback,
    )
    with torch.no_grad():  # what a blown-up update leaves behind
        for p in training.policy.parameters():
            p.fill_(float("nan"))
    training.collector.collect(training.buffer)
    losses = trainer._update(training.buffer)
    assert losses == {"rolled_back": 1.0} and loaded == ["ckpt"]
    assert training.learner.version == 2  # versions only move forward
    restored = training.policy.state_dict()
    assert all(torch.equal(restored[k], good["policy"][k]) for k in good["policy"])
    training.collector.collect(training.buffer)
    losses = trainer._update(training.buffer)  # the next update is finite again
    assert losses["nonfinite_updates"] == 0 and training.learner.version == 3
    compute.close()


def test_without_a_checkpoint_non_finite_training_still_stops() -> None:
    training = Training.build(tiny("ppo.max_nonfinite_updates=0"), "cpu")
    with torch.no_grad():
        for p in training.policy.parameters():
            p.fill_(float("nan"))
    training.collector.collect(training.buffer)
    with pytest.raises(NonFiniteTraining):
        training.learner.update(training.buffer)


def test_the_next_update_waits_for_a_snapshot_still_copying(monkeypatch) -> None:
    """The trainer starts a snapshot's copies and goes on; its next update must not move
    the weights under a copy that is still reading them (storage/staging.py fence)."""
    import threading

    import anyio
    import numpy as np

    from navrl_daemon.runtime.channels import Channel
    from navrl_daemon.runtime.compute import ComputeThread
    from navrl_daemon.stages.trainer import Checkpointing
    from navrl_daemon.storage.staging import SnapshotStaging

    release = threading.Event()
    copyto = np.copyto

    def held_copyto(dst, src, **kw):  # type: ignore[no-untyped-def]
        assert release.wait(10)
        copyto(dst, src, **kw)

    training = Training.build(tiny(), "cpu")
    monkeypatch.setattr(np, "copyto", held_copyto)  # only the snapshot's copies from here
    snapshots = Channel("snapshots", 4)
    received = snapshots.receiver()
    compute = ComputeThread()
    checkpoints = Checkpointing(snapshots.sender(), SnapshotStaging(2), static={})
    trainer = trainer_for(training, compute, checkpoints)
    training.collector.collect(training.buffer)
    trainer._update(training.buffer)
    expected = copy.deepcopy(training.policy.state_dict())
    anyio.run(lambda: trainer._snapshot(None, final=False))  # copies held up
    training.collector.collect(training.buffer)
    threading.Timer(0.2, release.set).start()
    trainer._update(training.buffer)  # waits at the fence, then steps
    assert release.is_set()
    snapshot = anyio.run(received.receive)
    snapshot.staged.ready()
    staged = snapshot.staged.state["learner"]["policy"]
    assert staged.keys() == expected.keys()
    assert all(torch.equal(staged[k], expected[k]) for k in expected)
    assert not all(torch.equal(staged[k], v) for k, v in training.policy.state_dict().items())
    compute.close()


def test_a_finished_trainer_leaves_no_copier_thread_behind() -> None:
    """Each run's snapshot staging has a copier thread; the trainer closes it when it ends
    (an in-process caller running the daemon again and again would pile them up)."""
    import anyio

    from navrl_daemon.pipeline.cadence import Cadence
    from navrl_daemon.runtime.channels import Channel
    from navrl_daemon.runtime.compute import ComputeThread
    from navrl_daemon.runtime.supervisor import Shutdown
    from navrl_daemon.stages.trainer import Checkpointing, Trainer, TrainerContext

    training = Training.build(tiny(), "cpu")
    rollouts, snapshots = Channel("rollouts", 1), Channel("snapshots", 4)
    received = snapshots.receiver()
    compute = ComputeThread()
    staging = SnapshotStaging(2)
    trainer = Trainer(
        training.learner,
        rollouts.receiver(),
        [],
        context=TrainerContext(
            cadence=Cadence(frames_per_iteration=64, total_frames=0, checkpoint_interval=1),
            shutdown=Shutdown(),
            compute=compute,
            state=training_state(training.learner, training.collector, None),
            export_path=None,
        ),
        checkpoints=Checkpointing(snapshots.sender(), staging, static={}),
    )
    training.collector.collect(training.buffer)
    trainer._update(training.buffer)
    anyio.run(lambda: trainer._snapshot(None, final=False))  # the copier thread starts
    assert staging._copier is not None
    threads = list(staging._copier._threads)
    rollouts.sender().close()  # no more rollouts: run() ends at once
    anyio.run(trainer.run)
    snapshot = anyio.run(received.receive)
    snapshot.staged.ready()  # the snapshot's copies were not cut short
    for thread in threads:
        thread.join(5)
    assert threads and not any(t.is_alive() for t in threads)
    compute.close()
