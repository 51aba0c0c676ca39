"""The run's state has one owner (rl/run_state.py): a part added in one place is saved
and restored through a real checkpoint file; older files come up to date through the
migrations, in one place."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch

from navrl_daemon.config import load_config
from navrl_daemon.errors import DataError
from navrl_daemon.pipeline import resume
from navrl_daemon.rl.collector import Collector
from navrl_daemon.rl.curriculum import Curriculum
from navrl_daemon.rl.policy import acting_copy
from navrl_daemon.rl.run_state import (
    COLLECTOR,
    LEARNER,
    SNAPSHOT_VERSION,
    RunState,
    migrate,
    training_state,
)
from navrl_daemon.rl.training import Training
from navrl_daemon.runtime.channels import Channel
from navrl_daemon.runtime.compute import ComputeThread
from navrl_daemon.stages.trainer import Checkpointing
from navrl_daemon.storage.checkpoint import CheckpointDir, encode_checkpoint, load_checkpoint
from navrl_daemon.storage.staging import SnapshotStaging
from tests.conftest import TINY, trainer_for

DATA = Path(__file__).parent.parent / "data"
# Written by the code before parts had names (tests/data/README.md says how).
FORMAT_1 = DATA / "run_state_format_1.nrc"
RECIPE = Path(__file__).parent.parent.parent / "config" / "navrl.toml"
FORMAT_1_RUN = (
    *TINY,
    'env.curriculum=[{name = "a", promote = {reach_goal = 0.0}}, {}]',
    "env.navigation.map_levels=[0,2,4]",
)


class Odometer:
    """A stateful part only this test knows: a count and a tensor."""

    def __init__(self, start: int) -> None:
        self.count = start
        self.trace = torch.arange(3.0) * start

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count, "trace": self.trace.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count = int(state["count"])
        self.trace = state["trace"].clone()


def test_a_part_added_in_one_place_survives_a_checkpoint_file(tmp_path: Path) -> None:
    """One `add` per half: the trainer's snapshot and the collector's capture carry it
    into a checkpoint file, and a resume from that file loads it back."""
    cfg = load_config(None, TINY, environ={})
    a = Training.build(cfg, "cpu")
    parts = training_state(a.learner, a.collector, None)
    parts.add(LEARNER, "odometer", Odometer(7))
    parts.add(COLLECTOR, "trip", Odometer(3))
    snapshots: Channel = Channel("snapshots", 1)
    received = snapshots.receiver()
    compute = ComputeThread()
    checkpointing = Checkpointing(
        snapshots.sender(), SnapshotStaging(1), static=resume.static_state(cfg)
    )
    trainer = trainer_for(a, compute, checkpointing, state=parts)
    a.collector.collect(a.buffer)
    collected = parts.capture(COLLECTOR)  # as the producer does after the rollout
    trainer._update(a.buffer)
    anyio.run(lambda: trainer._snapshot(collected, final=False))
    snapshot = anyio.run(received.receive)
    snapshot.staged.ready()
    directory = CheckpointDir(tmp_path / "checkpoints", accept=resume.CheckpointFit(cfg))
    blob = encode_checkpoint(snapshot.staged.state, iteration=1, frames=64, policy_version=1)
    directory.write(blob, 1)
    compute.close()

    b = Training.build(cfg, "cpu")
    odometer, trip = Odometer(0), Odometer(0)
    restored = training_state(b.learner, b.collector, None)
    restored.add(LEARNER, "odometer", odometer)
    restored.add(COLLECTOR, "trip", trip)
    found = resume.newest_checkpoint(directory)
    assert found is not None
    resumed = resume.restore(cfg, *found, restored, b.learner, b.collector)
    assert resumed.env_restored and b.learner.version == 1
    assert (odometer.count, trip.count) == (7, 3)
    assert torch.equal(odometer.trace, torch.arange(3.0) * 7)
    assert torch.equal(trip.trace, torch.arange(3.0) * 3)


def test_a_part_name_is_taken_once_per_half() -> None:
    parts = RunState()
    parts.add(LEARNER, "odometer", Odometer(1))
    parts.add(COLLECTOR, "odometer", Odometer(1))  # the other half: its own names
    with pytest.raises(ValueError, match="odometer"):
        parts.add(LEARNER, "odometer", Odometer(2))


def as_format_2(state: dict[str, Any]) -> dict[str, Any]:
    """A state of today's layout as format 2 wrote it: the embedded backend's keys in the
    env section itself, not in env.navigation."""
    state = copy.deepcopy(state)
    env = state["config"]["env"]
    env.update(env.pop("navigation"))
    return {**state, "snapshot_version": 2}


@pytest.mark.parametrize("version", [1, 2])
def test_an_older_file_restores_every_part_it_holds(tmp_path: Path, version: int) -> None:
    """The committed file from before parts had names (curriculum at stage 1, density
    levels), and the same state as format 2 held it, load into a run of its config:
    learner, env, running TensorDict, action generator and curriculum progress are the
    file's, and its settings are the run's."""
    state_dir = tmp_path / "state"
    (state_dir / "checkpoints").mkdir(parents=True)
    path = state_dir / "checkpoints" / "ckpt-000000004.nrc"
    header, saved = load_checkpoint(FORMAT_1)
    assert saved["snapshot_version"] == 1  # what the file is a test of
    if version == 1:
        shutil.copy(FORMAT_1, path)
    else:
        fields = ("iteration", "frames", "policy_version", "meta")
        path.write_bytes(
            encode_checkpoint(
                as_format_2(migrate(saved, FORMAT_1)), **{f: getattr(header, f) for f in fields}
            )
        )
    cfg = load_config(None, list(FORMAT_1_RUN), environ={})
    curriculum = Curriculum(cfg.env)
    training = Training.build(cfg, "cpu")
    train_cfg = cfg.model_copy(update={"env": curriculum.env_config(0)})
    collector = Collector.build(train_cfg, acting_copy(training.policy), "cpu")
    collector.new_buffer()
    parts = training_state(training.learner, collector, curriculum)
    directory = CheckpointDir(state_dir / "checkpoints", accept=resume.CheckpointFit(cfg))
    found = resume.newest_checkpoint(directory)
    assert found is not None and found[2]["snapshot_version"] == SNAPSHOT_VERSION
    assert resume.changed_settings(cfg, found[2]) == []
    resumed = resume.restore(cfg, *found, parts, training.learner, collector, curriculum)
    assert (resumed.iteration, resumed.env_restored, resumed.curriculum_restored) == (4, True, True)
    assert curriculum.state_dict() == saved["collector"]["curriculum"]
    assert curriculum.applied == 1  # the training env is at the file's stage
    same(training.learner.state_dict(), saved["learner"])
    now = collector.state_dict()
    assert now is not None
    for key in ("env", "td", "sampler"):
        same(now[key], saved["collector"][key])


def same(now: Any, saved: Any, path: str = "") -> None:
    if isinstance(saved, torch.Tensor):
        assert torch.equal(now.cpu(), saved), path
    elif isinstance(saved, dict):
        assert set(now) == set(saved), path
        for key in saved:
            same(now[key], saved[key], f"{path}/{key}")
    elif isinstance(saved, (list, tuple)):
        assert len(now) == len(saved), path
        for i, (x, y) in enumerate(zip(now, saved, strict=True)):
            same(x, y, f"{path}[{i}]")
    else:
        assert now == saved, path


def test_format_1_is_migrated_in_one_place_and_the_file_left_alone() -> None:
    _, saved = load_checkpoint(FORMAT_1)
    old = copy.deepcopy(saved)
    for key in ("reach_hold", "min_level", "safety_weight"):  # keys format 1 grew late
        del old["config"]["env"][key]
    del old["collector"]["sampler"]
    old["collector"]["episodes"] = {"return": torch.zeros(1)}  # held by the earliest files
    before = copy.deepcopy(old)
    state = migrate(old, "old.nrc")
    assert state["snapshot_version"] == SNAPSHOT_VERSION
    env = state["config"]["env"]["navigation"]  # format 1 held them in the env section
    assert (env["reach_hold"], env["min_level"], env["safety_weight"]) == (0, 0, 1.0)
    assert env["map_levels"] == [0, 2, 4]  # what the file says stays
    assert torch.equal(state["collector"]["sampler"], old["collector"]["rng"]["torch"])
    assert "episodes" not in state["collector"]
    same(old, before)  # the loaded state is not changed in place


def test_a_format_2_checkpoint_of_the_navrl_recipe_resumes_with_its_settings() -> None:
    """A run on config/navrl.toml with a CPU run's overrides, its checkpoint written in
    format 2 (every env key in the env section), resumes under the same config and
    overrides with no setting changed and the env's own config the same (its episodes go
    on), whether the config names the keys in [env.navigation] or the old way."""
    run = [
        "env.num_envs=256",
        "ppo.rollout_length=128",
        "run.torch_threads=1",
        "ppo.update_path=fused",
        "ppo.compile=true",
        "run.seed=3",
        "metrics.enabled=false",
    ]
    cfg = load_config(RECIPE, run, environ={})
    assert cfg.env.navigation.map_levels and cfg.env.navigation.num_maps == 16
    written = as_format_2({"config": cfg.model_dump(), "snapshot_version": SNAPSHOT_VERSION})
    state = migrate(written, "ckpt.nrc")
    assert resume.changed_settings(cfg, state) == []
    assert state["config"]["env"] == cfg.env.model_dump()  # restore's test of the env
    old_names = load_config(RECIPE, [*run, "env.num_maps=16"], environ={})
    assert old_names == cfg and resume.changed_settings(old_names, state) == []


def test_a_file_of_a_newer_format_is_refused_not_guessed() -> None:
    with pytest.raises(DataError, match="newer navrl-daemon"):
        migrate({"snapshot_version": SNAPSHOT_VERSION + 1}, "new.nrc")
