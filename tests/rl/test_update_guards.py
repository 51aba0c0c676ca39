"""The update's two guards, off by default (NavRL's update): the feature extractor's own
gradient clip (ppo.feature_extractor_max_grad_norm) and the KL early stop (ppo.target_kl),
and the statistics reported with or without them (feature_extractor_grad_norm, kl,
kl_stopped_steps)."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

from navrl_daemon.config import PPOConfig
from navrl_daemon.rl import ppo
from navrl_daemon.rl.policy import NavRLPolicy
from tests.conftest import TINY, navrl_cli

SMALL = PPOConfig(epochs=2, minibatches=4)
STEPS = SMALL.epochs * SMALL.minibatches


def _grad_norm(params) -> float:
    return math.sqrt(sum(float(p.grad.pow(2).sum()) for p in params if p.grad is not None))


def _with_grads(make_batch) -> tuple[NavRLPolicy, list[torch.Tensor]]:
    """A policy whose parameters hold the gradients of one minibatch's PPO loss."""
    torch.manual_seed(0)
    policy = NavRLPolicy()
    batch = make_batch(policy, num_envs=4, steps=6)
    advantages, targets = ppo.advantages_and_targets(copy.deepcopy(policy), batch, SMALL)
    mb = ppo.update_data(batch, advantages, targets).reshape(-1)
    terms, _, _ = ppo.tensor_losses(policy, *ppo.loss_inputs(mb), 1e-3, SMALL)
    sum(terms.values()).backward()
    return policy, [p.grad.clone() for p in policy.feature_extractor.parameters()]


def _update(policy, batch, cfg, seed=0):
    opts = ppo.make_optimizers(policy, cfg)
    return ppo.update(policy, opts, batch, cfg, torch.Generator().manual_seed(seed))


def test_kl_estimate_hand_computed():
    assert float(ppo.kl_estimate(torch.zeros(5))) == 0.0
    # log r = ln 2: (2 - 1) - ln 2; averaged with a row at r = 1.
    got = ppo.kl_estimate(torch.tensor([0.0, math.log(2.0)]))
    assert float(got) == pytest.approx((1.0 - math.log(2.0)) / 2)
    assert float(ppo.kl_estimate(torch.tensor([-0.3, 0.7]))) > 0.0


def test_the_extractor_norm_is_reported_and_left_unclipped_by_default(make_batch):
    policy, before = _with_grads(make_batch)
    want = _grad_norm(policy.feature_extractor.parameters())
    actor, critic, extractor = ppo.clip_gradients(policy, SMALL)
    assert float(extractor) == pytest.approx(want, rel=1e-5)
    for p, g in zip(policy.feature_extractor.parameters(), before, strict=True):
        assert torch.equal(p.grad, g)  # NavRL: the shared trunk is not clipped
    assert float(actor) > 0 and float(critic) > 0


def test_the_extractor_clip_bounds_its_norm_and_only_its_own(make_batch):
    policy, before = _with_grads(make_batch)
    navrl, _ = _with_grads(make_batch)  # the same weights and gradients
    want = _grad_norm(policy.feature_extractor.parameters())
    limit = want / 10
    cfg = SMALL.model_copy(update={"feature_extractor_max_grad_norm": limit})
    _, _, extractor = ppo.clip_gradients(policy, cfg)
    ppo.clip_gradients(navrl, SMALL)
    assert float(extractor) == pytest.approx(want, rel=1e-5)  # reported before the clip
    assert _grad_norm(policy.feature_extractor.parameters()) == pytest.approx(limit, rel=1e-4)
    for p, g in zip(policy.feature_extractor.parameters(), before, strict=True):
        torch.testing.assert_close(p.grad, g * (limit / want), rtol=1e-4, atol=1e-9)
    # The heads' gradients are clipped as in NavRL's update (ppo.max_grad_norm) either way.
    heads = (*policy.actor.parameters(), *policy.critic_parameters())
    for p, q in zip(heads, (*navrl.actor.parameters(), *navrl.critic_parameters()), strict=True):
        assert torch.equal(p.grad, q.grad)


def test_a_clipped_extractor_moves_less_in_an_update(make_batch):
    torch.manual_seed(1)
    base = NavRLPolicy()
    batch = make_batch(base, num_envs=8, steps=6)
    start = [p.detach().clone() for p in base.feature_extractor.parameters()]

    def moved(cfg: PPOConfig) -> float:
        policy = copy.deepcopy(base)
        stats = _update(policy, batch, cfg)
        assert stats["feature_extractor_grad_norm"] > 0
        return math.sqrt(
            sum(
                float((p.detach() - s).pow(2).sum())
                for p, s in zip(policy.feature_extractor.parameters(), start, strict=True)
            )
        )

    free = moved(SMALL)
    # Adam divides by the gradients' scale, so a clip that holds every step at the same
    # norm changes little; a spike is what it bounds. Here: one tiny limit for all steps
    # still changes the extractor's steps (Adam's epsilon), and never enlarges them.
    clipped = moved(SMALL.model_copy(update={"feature_extractor_max_grad_norm": 1e-9}))
    assert clipped < free


def test_without_a_target_kl_every_step_is_taken_and_the_kl_reported(make_batch):
    torch.manual_seed(2)
    policy = NavRLPolicy()
    batch = make_batch(policy, num_envs=8, steps=6)
    stats = _update(policy, batch, SMALL)
    assert stats["minibatch_updates"] == STEPS
    assert stats["kl_stopped_steps"] == 0
    assert 0.0 < stats["kl"] < 0.5


def test_a_loose_target_kl_changes_nothing(make_batch):
    torch.manual_seed(3)
    base = NavRLPolicy()
    batch = make_batch(base, num_envs=8, steps=6)
    plain, loose = copy.deepcopy(base), copy.deepcopy(base)
    a = _update(plain, batch, SMALL)
    b = _update(loose, batch, SMALL.model_copy(update={"target_kl": 1.0}))
    assert b["kl_stopped_steps"] == 0
    assert a == {**b}
    for x, y in zip(plain.state_dict().values(), loose.state_dict().values(), strict=True):
        assert torch.equal(x, y)


def test_the_kl_early_stop_ends_the_update_before_the_step_over_the_bar(make_batch):
    """The first minibatch is on the rollout's own policy (KL 0): its step is taken; the
    second sees the moved policy, over a tiny bar: it and the rest are left out."""
    torch.manual_seed(4)
    base = NavRLPolicy()
    batch = make_batch(base, num_envs=8, steps=6)
    stopped = copy.deepcopy(base)
    stats = _update(stopped, batch, SMALL.model_copy(update={"target_kl": 1e-9}))
    assert stats["minibatch_updates"] == 1
    assert stats["kl_stopped_steps"] == STEPS - 1
    assert stats["nonfinite_updates"] == 0
    assert stats["kl"] < 1e-9  # the one step taken: the rollout's own policy

    # The same weights as an update whose every step after the first is aborted.
    one_step = copy.deepcopy(base)
    opts = ppo.make_optimizers(one_step, SMALL)
    abort = _AbortAfter(1)
    ppo.update(one_step, opts, batch, SMALL, torch.Generator().manual_seed(0), abort=abort)
    for x, y in zip(stopped.state_dict().values(), one_step.state_dict().values(), strict=True):
        assert torch.equal(x, y)
    moved = any(
        not torch.equal(x, y)
        for x, y in zip(stopped.state_dict().values(), base.state_dict().values(), strict=True)
    )
    assert moved


class _AbortAfter:
    """An `abort` event that reads as set from its (n + 1)-th check on."""

    def __init__(self, n: int) -> None:
        self.checks = 0
        self.n = n

    def is_set(self) -> bool:
        self.checks += 1
        return self.checks > self.n


def test_a_run_reports_the_guards_in_its_history(tmp_path):
    """A daemon run with both guards: every history row carries the extractor's norm, the
    KL and the steps the early stop left out, and the stop did act."""
    state = tmp_path / "s"
    proc = navrl_cli(
        "run",
        "--state-dir",
        str(state),
        *TINY,
        "run.total_frames=640",
        "ppo.target_kl=0.001",
        "ppo.feature_extractor_max_grad_norm=0.05",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (state / "history.jsonl").read_text().splitlines()]
    assert rows
    for row in rows:
        assert row["feature_extractor_grad_norm"] > 0
        assert row["kl"] >= 0
        assert row["minibatch_updates"] + row["kl_stopped_steps"] > 0
    assert any(row["kl_stopped_steps"] > 0 for row in rows)
