"""PPO loss terms on hand-computed numbers, and update() on synthetic batches."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from navrl_daemon.config import PPOConfig
from navrl_daemon.rl import ppo
from navrl_daemon.rl.gae import compute_gae
from navrl_daemon.rl.policy import NavRLPolicy

SMALL = PPOConfig(epochs=2, minibatches=4)


# ---------------------------------------------------------------------------- loss terms


def test_actor_loss_hand_computed():
    # ratios 1.5, 0.5, 0.5 with advantages 2, 1, −1 and clip 0.1:
    #   min(1.5·2, 1.1·2) = 2.2   (clipped: the ratio ran ahead on a good action)
    #   min(0.5·1, 0.9·1) = 0.5   (not clipped: min keeps the pessimistic unclipped term)
    #   min(0.5·−1, 0.9·−1) = −0.9 (clipped: bad action already made much less likely)
    # loss = −mean(2.2, 0.5, −0.9) × 3 = −0.6 × 3 = −1.8
    ratio = torch.tensor([1.5, 0.5, 0.5])
    log_prob = ratio.log() + 0.3
    old = torch.full((3,), 0.3)
    advantage = torch.tensor([[2.0], [1.0], [-1.0]])
    loss = ppo.actor_loss(log_prob, old, advantage, clip_ratio=0.1)
    assert loss.item() == pytest.approx(-1.8, abs=1e-6)
    assert ppo.actor_loss(log_prob, old, advantage, 0.1, action_dim=1).item() == pytest.approx(
        -0.6, abs=1e-6
    )


def test_dual_clip_holds_rows_with_a_negative_advantage_hand_computed():
    # ratios 5, 5, 0.5 with advantages −1, 2, −1, clip 0.1, dual clip 3:
    #   min(5·−1, 1.1·−1) = −5, held at 3·−1: −3 (the far-off row pulls no more)
    #   min(5·2, 1.1·2) = 2.2   (positive advantage: untouched)
    #   min(0.5·−1, 0.9·−1) = −0.9, above −3: untouched
    ratio = torch.tensor([5.0, 5.0, 0.5], requires_grad=True)
    advantage = torch.tensor([[-1.0], [2.0], [-1.0]])
    old = torch.zeros(3)
    loss = ppo.actor_loss(ratio.log(), old, advantage, 0.1, action_dim=1, dual_clip=3.0)
    assert loss.item() == pytest.approx(-(-3.0 + 2.2 - 0.9) / 3, abs=1e-6)
    loss.backward()
    assert ratio.grad.tolist() == [0.0, 0.0, 0.0]  # every row clipped one way or the other
    plain = ppo.actor_loss(ratio.log(), old, advantage, 0.1, action_dim=1)
    assert plain.item() == pytest.approx(-(-5.0 + 2.2 - 0.9) / 3, abs=1e-6)
    # Off (0): NavRL's loss exactly.
    off = ppo.actor_loss(ratio.log(), old, advantage, 0.1, action_dim=1, dual_clip=0.0)
    assert torch.equal(off, plain)


def test_critic_loss_takes_the_max_of_the_two_means():
    # old 0, new [0.5, −0.05], target [1, 0], clip 0.1 → clipped [0.1, −0.05]
    # Huber (δ=10, quadratic here): clipped mean 0.5·(0.81 + 0.0025)/2 = 0.203125,
    # plain mean 0.5·(0.25 + 0.0025)/2 = 0.063125 → max = 0.203125
    value = torch.tensor([[0.5], [-0.05]])
    old = torch.zeros(2, 1)
    target = torch.tensor([[1.0], [0.0]])
    loss = ppo.critic_loss(value, old, target, value_clip=0.1, huber_delta=10.0)
    assert loss.item() == pytest.approx(0.203125, abs=1e-6)

    # clipping moves away from the target: old 0.9, new 0 → clipped 0.8
    # clipped 0.5·0.2² = 0.02, plain 0.5·1² = 0.5 → max = 0.5
    loss = ppo.critic_loss(
        torch.tensor([[0.0]]), torch.tensor([[0.9]]), torch.tensor([[1.0]]), 0.1, 10.0
    )
    assert loss.item() == pytest.approx(0.5, abs=1e-6)


def test_critic_loss_huber_linear_branch():
    # |error| 30 > δ 10: δ·(|e| − δ/2) = 10·25 = 250 (v = v_old, so clipping changes nothing)
    v = torch.tensor([[30.0]])
    assert ppo.critic_loss(v, v, torch.zeros(1, 1), 0.1, 10.0).item() == pytest.approx(250.0)


def test_entropy_loss_and_explained_variance():
    assert ppo.entropy_loss(torch.tensor([1.0, 3.0]), 1e-3).item() == pytest.approx(-2e-3)
    target = torch.tensor([[1.0], [2.0], [3.0]])
    assert ppo.explained_variance(target, target).item() == pytest.approx(1.0)
    # predicting the mean: MSE = biased var = 2/3, var (unbiased) = 1 → 1 − 2/3
    mean = torch.full_like(target, 2.0)
    assert ppo.explained_variance(mean, target).item() == pytest.approx(1 / 3, abs=1e-6)


# ---------------------------------------------------------------------------- set-up


def test_make_optimizers_groups_and_learning_rates():
    policy = NavRLPolicy()
    cfg = PPOConfig(actor_lr=1e-3, feature_extractor_lr=2e-4)
    opts = ppo.make_optimizers(policy, cfg)
    assert set(opts) == {"feature_extractor", "actor", "critic"}
    lrs = {name: opt.param_groups[0]["lr"] for name, opt in opts.items()}
    assert lrs == {"feature_extractor": 2e-4, "actor": 1e-3, "critic": 1e-3}
    groups = [{id(p) for g in opt.param_groups for p in g["params"]} for opt in opts.values()]
    assert sum(len(g) for g in groups) == len(set().union(*groups))  # disjoint
    assert set().union(*groups) == {id(p) for p in policy.parameters()}
    assert {id(p) for p in policy.critic.parameters()} == groups[2]


def test_minibatch_indices_drop_the_remainder():
    g = torch.Generator().manual_seed(3)
    idx = ppo.minibatch_indices(10, 3, g, torch.device("cpu"))
    assert idx.shape == (3, 3)
    assert len(set(idx.flatten().tolist())) == 9
    again = ppo.minibatch_indices(10, 3, torch.Generator().manual_seed(3), torch.device("cpu"))
    assert torch.equal(idx, again)
    with pytest.raises(ValueError):
        ppo.minibatch_indices(2, 3, g, torch.device("cpu"))


# ---------------------------------------------------------------------------- update


def test_value_moves_measure_the_shift_and_the_rows_beyond_the_clip():
    value = torch.tensor([[0.5], [-0.05], [0.25], [-0.3]], requires_grad=True)
    old = torch.tensor([[0.0], [0.0], [0.3], [0.0]])
    shift, clipped = ppo.value_moves(value, old, value_clip=0.1)
    assert shift.item() == pytest.approx((0.5 + 0.05 + 0.05 + 0.3) / 4)
    assert clipped.item() == 0.5  # 0.5 and -0.3 are beyond 0.1, either way


def test_the_value_clip_holds_the_critic_back(make_batch):
    """NavRL's critic loss (a max of the clipped and plain means) lets each row's value
    move about `value_clip` from the rollout's before the clipped mean takes over: with a
    tight clip the update's values stay nearer V_old than with the clip off, and the
    update says how many rows it held back."""
    torch.manual_seed(0)
    base = NavRLPolicy()
    batch = make_batch(base, num_envs=8, steps=6)
    stats = {}
    for clip in (0.01, 1e6):
        cfg = PPOConfig(epochs=8, minibatches=2, value_clip=clip, actor_lr=2e-3)
        policy = copy.deepcopy(base)
        opts = ppo.make_optimizers(policy, cfg)
        stats[clip] = ppo.update(policy, opts, batch, cfg, torch.Generator().manual_seed(0))
    assert stats[1e6]["value_clipped"] == 0.0
    assert stats[0.01]["value_clipped"] > 0.3
    assert stats[0.01]["value_shift"] < 0.5 * stats[1e6]["value_shift"]


def _snapshot(policy: NavRLPolicy) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in policy.state_dict().items()}


def test_update_trains_and_reports(make_batch):
    torch.manual_seed(0)
    policy = NavRLPolicy()
    batch = make_batch(policy, num_envs=8, steps=6)
    before = _snapshot(policy)
    opts = ppo.make_optimizers(policy, SMALL)
    stats = ppo.update(policy, opts, batch, SMALL, torch.Generator().manual_seed(0))

    assert set(stats) == {
        *ppo.STAT_NAMES,
        "minibatch_updates",
        "nonfinite_updates",
        "kl_stopped_steps",
    }
    assert stats["minibatch_updates"] == SMALL.epochs * SMALL.minibatches
    assert stats["nonfinite_updates"] == 0
    assert all(math.isfinite(v) for v in stats.values())
    after = policy.state_dict()
    for prefix in ("feature_extractor.", "actor.", "critic."):
        assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith(prefix)), (
            prefix
        )
    # ValueNorm folded in one batch of returns; the GAE buffers are untouched.
    assert after["value_norm.debiasing_term"].item() == pytest.approx(0.005)
    assert torch.equal(before["gae.gamma"], after["gae.gamma"])
    assert all(p.grad is None for p in policy.parameters())


def test_update_is_deterministic_given_the_generator(make_batch):
    torch.manual_seed(0)
    base = NavRLPolicy()
    batch = make_batch(base, num_envs=8, steps=6)

    def run(seed: int) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
        policy = copy.deepcopy(base)
        stats = ppo.update(
            policy,
            ppo.make_optimizers(policy, SMALL),
            batch,
            SMALL,
            torch.Generator().manual_seed(seed),
        )
        return stats, policy.state_dict()

    stats_a, sd_a = run(7)
    stats_b, sd_b = run(7)
    _, sd_c = run(8)
    assert stats_a == stats_b
    assert all(torch.equal(sd_a[k], sd_b[k]) for k in sd_a)
    assert any(not torch.equal(sd_a[k], sd_c[k]) for k in sd_a)


def test_nan_reward_skips_every_step_and_leaves_weights_alone(make_batch):
    torch.manual_seed(0)
    policy = NavRLPolicy()
    batch = make_batch(policy, num_envs=8, steps=6)
    opts = ppo.make_optimizers(policy, SMALL)
    ppo.update(policy, opts, batch, SMALL, torch.Generator().manual_seed(0))  # Adam has state now
    before = _snapshot(policy)
    adam_before = copy.deepcopy(opts["actor"].state_dict())

    batch["next", "agents", "reward"][2, 3, 0] = float("nan")
    stats = ppo.update(policy, opts, batch, SMALL, torch.Generator().manual_seed(1))

    assert stats["nonfinite_updates"] == SMALL.epochs * SMALL.minibatches
    assert stats["minibatch_updates"] == 0
    assert math.isnan(stats["actor_loss"])
    after = policy.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # incl. ValueNorm
    adam_after = opts["actor"].state_dict()["state"]
    for i, state in adam_before["state"].items():
        assert torch.equal(state["step"], adam_after[i]["step"])
        assert torch.equal(state["exp_avg"], adam_after[i]["exp_avg"])

    # and training carries on normally with a clean batch
    batch["next", "agents", "reward"][2, 3, 0] = 0.0
    stats = ppo.update(policy, opts, batch, SMALL, torch.Generator().manual_seed(2))
    assert stats["nonfinite_updates"] == 0
    assert all(math.isfinite(v) for v in stats.values())


def test_update_from_the_checkpoint_keeps_losses_sane(navrl_policy, make_batch):
    """The published weights and ValueNorm give finite, moderate losses on random obs."""
    batch = make_batch(navrl_policy, num_envs=4, steps=8, seed=1)
    cfg = PPOConfig(epochs=1, minibatches=2)
    stats = ppo.update(
        navrl_policy, ppo.make_optimizers(navrl_policy, cfg), batch, cfg, torch.Generator()
    )
    assert stats["minibatch_updates"] == 2
    assert all(math.isfinite(v) for v in stats.values())


def test_advantages_and_targets_wiring(navrl_policy, make_batch):
    """GAE runs in return units (both values denormalised); targets use the updated norm."""
    batch = make_batch(navrl_policy, num_envs=3, steps=5, seed=2)
    vn = navrl_policy.value_norm
    with torch.no_grad():
        next_value = navrl_policy.value(navrl_policy.observe(batch["next"]))
        adv, ret = compute_gae(
            batch["next", "agents", "reward"],
            batch["next", "terminated"],
            batch["next", "truncated"],
            vn.denormalize(batch["state_value"]),
            vn.denormalize(next_value),
            0.9,
            0.8,
            cut_truncation=False,
        )
    cfg = PPOConfig(gamma=0.9, lmbda=0.8, gae_cut_truncation=False)
    advantages, targets = ppo.advantages_and_targets(navrl_policy, batch, cfg)

    torch.testing.assert_close(advantages, (adv - adv.mean()) / adv.std())
    mean, var = vn.mean_var()
    torch.testing.assert_close(targets, (ret - mean) / var.sqrt())
    # the norm moved towards this batch's returns (ValueNorm.update ran exactly once)
    assert vn.debiasing_term.item() == pytest.approx(0.995 * 0.999994 + 0.005, abs=1e-6)
