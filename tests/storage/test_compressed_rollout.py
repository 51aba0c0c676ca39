"""`pipeline.compress_rollouts`: the compressed minibatch source is exact, releases the
rollout before the epochs, and a daemon runs with it on one rollout buffer."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from navrl_daemon.config import load_config
from navrl_daemon.errors import ConfigError
from navrl_daemon.rl import ppo
from navrl_daemon.rl.learner import Learner
from navrl_daemon.rl.training import Training
from navrl_daemon.storage.compressed_rollout import CompressedMinibatches
from tests.conftest import TINY, navrl_cli


def tiny(*extra: str):
    return load_config(None, [*TINY, "ppo.epochs=2", *extra], environ={})


def collected() -> Training:
    training = Training.build(tiny(), "cpu")
    training.collector.collect(training.buffer)
    return training


def updated(training: Training, source: ppo.MinibatchSource) -> tuple[dict, dict]:
    policy = copy.deepcopy(training.policy)
    optimizers = ppo.make_optimizers(policy, training.cfg.ppo)
    generator = torch.Generator().manual_seed(7)
    losses = ppo.update(
        policy, optimizers, training.buffer.clone(), training.cfg.ppo, generator, minibatches=source
    )
    return losses, policy.state_dict()


def test_compressed_update_is_bit_identical_to_env_minibatches_uncompressed() -> None:
    training = collected()
    plain_losses, plain = updated(training, ppo.env_minibatches)
    source = CompressedMinibatches(workers=2)
    losses, params = updated(training, source)
    assert losses == plain_losses
    assert all(torch.equal(params[k], plain[k]) for k in plain)
    assert losses["minibatch_updates"] == 2 * 4  # epochs x minibatches
    _, frames = updated(training, ppo.frame_minibatches)
    assert any(not torch.equal(frames[k], plain[k]) for k in plain)  # a different sampling
    assert 0 < source.stats.stored_bytes < source.stats.raw_bytes


def test_the_learner_reports_the_compression_of_each_update() -> None:
    training = collected()
    source = CompressedMinibatches(workers=1)
    learner = Learner.build(training.cfg, training.policy, "cpu", minibatches=source)
    stats = learner.update(training.buffer)
    assert stats["compress_ratio"] > 1.0  # what progress lines and history show
    assert stats["compress_s"] > 0.0 and stats["decode_s"] > 0.0
    assert "compress_ratio" not in Training.build(tiny(), "cpu").learner.update(training.buffer)


def test_every_epoch_sees_each_env_once_decoded_exactly_and_release_comes_first() -> None:
    training = collected()
    cfg = training.cfg.ppo
    data = training.buffer.select(
        ("agents", "observation", "lidar"), ("agents", "action_normalized"), "sample_log_prob"
    )
    events: list[str] = []
    source = CompressedMinibatches(workers=2)
    minibatches = source(
        data, cfg, torch.Generator().manual_seed(0), torch.device("cpu"), lambda: events.append("r")
    )
    seen = []
    for mb in minibatches:
        events.append("mb")
        assert mb.batch_size == torch.Size([2 * 8])  # 8 envs / 4 minibatches, x 8 steps
        seen.append(mb)
    assert events == ["r"] + ["mb"] * (cfg.epochs * cfg.minibatches)
    for epoch in range(cfg.epochs):
        rows = torch.cat([mb.get("sample_log_prob") for mb in seen[epoch * 4 : epoch * 4 + 4]])
        want = data.get("sample_log_prob").reshape(-1)
        assert torch.equal(rows.sort().values, want.sort().values)
    lidar = seen[0].get(("agents", "observation", "lidar"))
    flat = data.get(("agents", "observation", "lidar")).reshape(8, 8, *lidar.shape[1:])
    matches = [torch.equal(lidar[:8], flat[e]) for e in range(8)]  # one env's 8 steps
    assert matches.count(True) >= 1


def test_config_allows_one_buffer_at_lag_one_only_with_compression() -> None:
    with pytest.raises(ConfigError, match="compress_rollouts = true"):
        tiny("pipeline.max_policy_lag=1", "pipeline.lease_pool=1")
    tiny("pipeline.max_policy_lag=1", "pipeline.lease_pool=1", "pipeline.compress_rollouts=true")
    with pytest.raises(ConfigError, match=r"at most env\.num_envs = 8"):
        tiny("pipeline.compress_rollouts=true", "ppo.minibatches=16")


def test_daemon_trains_on_compressed_rollouts_with_one_buffer(tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc = navrl_cli(
        "run",
        "--state-dir",
        str(state),
        *TINY,
        "run.total_frames=384",
        "pipeline.compress_rollouts=true",
        "pipeline.max_policy_lag=1",
        "pipeline.lease_pool=1",
    )
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    exported = [r for r in lines if r["event"] == "policy exported"]
    assert exported and exported[0]["iteration"] == 6 and exported[0]["frames"] == 384
