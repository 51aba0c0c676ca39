"""`ppo.separate_critic`: the critic head on a feature extractor of its own, so the value
loss never moves the actor's features; NavRL's layout in and out."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from navrl_daemon.config import PPOConfig
from navrl_daemon.rl import ppo
from navrl_daemon.rl.policy import CRITIC_EXTRACTOR, NavRLPolicy, navrl_layout
from navrl_daemon.storage.checkpoint import load_checkpoint
from navrl_daemon.storage.policy_file import load_policy_state
from tests.conftest import REPO, TINY, navrl_cli
from tests.rl.conftest import synthetic_batch
from tests.test_resume import events, exported, run

NAVRL_CHECKPOINT = REPO / "tests" / "data" / "navrl_checkpoint.pt"
SEPARATE = PPOConfig(epochs=1, minibatches=2, separate_critic=True)


def grads(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad for p in module.parameters() if p.grad is not None and p.grad.any()]


def losses(policy: NavRLPolicy, cfg: PPOConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The actor's and the critic's loss on a synthetic minibatch of 24 rows."""
    batch = synthetic_batch(policy, num_envs=4, steps=6).reshape(-1)
    obs = batch["agents", "observation"]
    terms, _, _ = ppo.tensor_losses(
        policy,
        obs["state"],
        obs["lidar"],
        obs["dynamic_obstacle"],
        batch["agents", "action_normalized"],
        batch["sample_log_prob"],
        torch.randn(24, 1),
        batch["state_value"],
        torch.randn(24, 1),
        0.001,
        cfg,
    )
    return terms["actor_loss"], terms["critic_loss"]


def test_navrl_layers_draw_the_same_initial_weights_with_or_without():
    torch.manual_seed(0)
    shared = NavRLPolicy().state_dict()
    torch.manual_seed(0)
    separate = NavRLPolicy(separate_critic=True)
    assert list(navrl_layout(separate.state_dict())) == list(shared)
    assert all(torch.equal(separate.state_dict()[k], v) for k, v in shared.items())
    assert any(k.startswith(CRITIC_EXTRACTOR) for k in separate.state_dict())


@pytest.mark.parametrize("separate", [False, True], ids=["shared", "separate"])
def test_the_value_loss_reaches_the_actor_features_only_when_shared(separate: bool):
    torch.manual_seed(1)
    policy = NavRLPolicy(separate_critic=separate)
    cfg = SEPARATE.model_copy(update={"separate_critic": separate})
    _, l_critic = losses(policy, cfg)
    l_critic.backward()
    assert bool(grads(policy.feature_extractor)) is not separate
    assert grads(policy.critic)
    if separate:
        assert grads(policy.critic_extractor)
        policy.zero_grad(set_to_none=True)
        l_actor, _ = losses(policy, cfg)
        l_actor.backward()
        assert grads(policy.feature_extractor) and grads(policy.actor)
        assert not grads(policy.critic_extractor) and not grads(policy.critic)


def test_one_update_moves_both_extractors_and_the_critics_clip_covers_its_own():
    torch.manual_seed(2)
    policy = NavRLPolicy(separate_critic=True)
    opts = ppo.make_optimizers(policy, SEPARATE)
    assert set(opts) == {"feature_extractor", "actor", "critic", "critic_extractor"}
    assert set(ppo.learning_rates(SEPARATE)) == set(opts)
    critic_params = {id(p) for p in policy.critic_parameters()}
    assert critic_params == {
        id(p) for p in (*policy.critic.parameters(), *policy.critic_extractor.parameters())
    }
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    batch = synthetic_batch(policy, num_envs=8, steps=6)
    stats = ppo.update(policy, opts, batch, SEPARATE, torch.Generator().manual_seed(0))
    assert stats["minibatch_updates"] == 2
    after = policy.state_dict()
    moved = {k for k in after if not torch.equal(after[k], before[k])}
    assert any(k.startswith(CRITIC_EXTRACTOR) for k in moved)
    assert any(k.startswith("feature_extractor.") for k in moved)


def test_navrl_checkpoint_loads_with_the_critic_starting_as_a_copy():
    """NavRL's file (no own critic) loads strictly; the critic's extractor is then the
    shared one's copy, so values and actions are NavRL's, until training moves it."""
    state = load_policy_state(NAVRL_CHECKPOINT)
    shared, separate = NavRLPolicy(), NavRLPolicy(separate_critic=True)
    shared.load_state_dict(state)
    separate.load_state_dict(state)
    td = synthetic_batch(shared, num_envs=4, steps=3)
    obs = td.select(("agents", "observation"))
    with torch.no_grad():
        a = shared.act(obs.clone(), deterministic=True)
        b = separate.act(obs.clone(), deterministic=True)
    torch.testing.assert_close(a["state_value"], b["state_value"])
    torch.testing.assert_close(a["agents", "action"], b["agents", "action"])
    assert navrl_layout(separate.state_dict()).keys() == state.keys()
    own = separate.critic_extractor.state_dict()
    assert all(torch.equal(v, state["feature_extractor." + k]) for k, v in own.items())


def test_a_run_turns_it_on_at_a_resume_and_exports_navrl_layout(tmp_path: Path):
    """A run without it resumes with it (the critic's extractor from the shared one, its
    optimiser afresh), trains that extractor apart, and exports NavRL's 37 keys."""
    state = tmp_path / "state"
    run(state, "checkpoint.interval=2", "run.total_frames=256")
    # a change of algorithm at a resume, on purpose
    resumed = run(
        state, "ppo.separate_critic=true", "run.allow_config_change=true", "run.total_frames=512"
    )
    start = next(e for e in resumed if e["event"] == "resumed from checkpoint")
    assert start["iteration"] == 4
    _, snap = load_checkpoint(state / "checkpoints" / "ckpt-000000008.nrc")
    policy = snap["learner"]["policy"]
    assert "critic_extractor" in snap["learner"]["optimizers"]
    trained = {k: v for k, v in policy.items() if k.startswith(CRITIC_EXTRACTOR)}
    assert trained and any(
        not torch.equal(v, policy["feature_extractor." + k.removeprefix(CRITIC_EXTRACTOR)])
        for k, v in trained.items()
    )
    keys = list(load_policy_state(NAVRL_CHECKPOINT))
    assert len(keys) == 37
    assert sorted(exported(state)) == sorted(keys)
    out = tmp_path / "navrl.pt"
    proc = navrl_cli("checkpoints", "export", "--state-dir", str(state), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert sorted(torch.load(out, weights_only=True)) == sorted(keys)
    assert sorted(navrl_layout(policy)) == sorted(keys)


def test_turned_off_it_exits_78_and_never_falls_back_to_an_older_checkpoint(tmp_path: Path):
    """Turned off after a resume turned it on, the newest checkpoints (with an own critic)
    do not fit the config: exit 78 saying which setting they need, rather than going on
    from the older checkpoint without one and moving the newer aside; no file moves."""
    state = tmp_path / "state"
    run(state, "checkpoint.interval=2", "run.total_frames=256")
    allow = "run.allow_config_change=true"  # past the settings check, to the checkpoints'
    run(state, "ppo.separate_critic=true", allow, "checkpoint.interval=2", "run.total_frames=512")
    files = sorted((state / "checkpoints").glob("*.nrc"))
    assert len(files) >= 3
    proc = navrl_cli("run", "--state-dir", str(state), *TINY, allow, "run.total_frames=768")
    assert proc.returncode == 78, proc.stderr[-2000:]
    assert "set ppo.separate_critic = true to go on from them" in proc.stderr
    assert sorted((state / "checkpoints").glob("*.nrc")) == files
    assert not [e for e in events(proc.stderr) if e["event"] == "resumed from checkpoint"]


@pytest.mark.parametrize("value", ["1", '"yes"'])
def test_a_non_boolean_exits_78_naming_the_key(value: str):
    proc = navrl_cli("config", "show", f"ppo.separate_critic={value}")
    assert proc.returncode == 78, proc.stderr
    assert "separate_critic" in proc.stderr
