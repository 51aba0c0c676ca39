"""compute_gae against a plain double loop, and the truncation-cut semantics on small cases."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from navrl_daemon.rl.gae import GAE, compute_gae


def loop_gae(reward, terminated, truncated, value, next_value, gamma, lmbda, cut_truncation):
    """navrl-task §3 written out per env and per step, in Python floats."""
    n_envs, steps = len(reward), len(reward[0])
    adv = [[0.0] * steps for _ in range(n_envs)]
    for n in range(n_envs):
        gae = 0.0
        for t in reversed(range(steps)):
            not_term = 0.0 if terminated[n][t] else 1.0
            cut = terminated[n][t] or (cut_truncation and truncated[n][t])
            delta = reward[n][t] + gamma * next_value[n][t] * not_term - value[n][t]
            gae = delta + gamma * lmbda * (0.0 if cut else 1.0) * gae
            adv[n][t] = gae
    ret = [[adv[n][t] + value[n][t] for t in range(steps)] for n in range(n_envs)]
    return adv, ret


def _lists(x: torch.Tensor) -> list[list]:
    return x.squeeze(-1).tolist()


@settings(deadline=None, max_examples=60, database=None)
@given(
    n_envs=st.integers(1, 4),
    steps=st.integers(1, 12),
    seed=st.integers(0, 2**31 - 1),
    p_term=st.sampled_from([0.0, 0.1, 0.5]),
    p_trunc=st.sampled_from([0.0, 0.1, 0.5]),
    gamma=st.floats(0.5, 1.0),
    lmbda=st.floats(0.0, 1.0),
    cut_truncation=st.booleans(),
)
def test_matches_double_loop(n_envs, steps, seed, p_term, p_trunc, gamma, lmbda, cut_truncation):
    g = torch.Generator().manual_seed(seed)
    shape = (n_envs, steps, 1)
    reward = torch.randn(shape, generator=g, dtype=torch.float64)
    value = torch.randn(shape, generator=g, dtype=torch.float64) * 10
    next_value = torch.randn(shape, generator=g, dtype=torch.float64) * 10
    terminated = torch.rand(shape, generator=g) < p_term
    truncated = (torch.rand(shape, generator=g) < p_trunc) & ~terminated

    adv, ret = compute_gae(
        reward, terminated, truncated, value, next_value, gamma, lmbda, cut_truncation
    )
    exp_adv, exp_ret = loop_gae(
        *(_lists(x) for x in (reward, terminated, truncated, value, next_value)),
        gamma,
        lmbda,
        cut_truncation,
    )
    assert adv.shape == ret.shape == shape
    expected = torch.tensor(exp_adv, dtype=torch.float64).unsqueeze(-1)
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-9)
    expected = torch.tensor(exp_ret, dtype=torch.float64).unsqueeze(-1)
    torch.testing.assert_close(ret, expected, rtol=0, atol=1e-9)


def _one_env(xs: list[float]) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float64).view(1, -1, 1)


def test_truncation_bootstraps_and_cut_stops_the_leak():
    """A time-out at t=1 (auto-reset after it): δ_1 bootstraps from V(s_2) either way."""
    reward = _one_env([1.0, 1.0, 5.0])
    value = _one_env([0.0, 0.0, 0.0])
    next_value = _one_env([0.0, 10.0, 0.0])  # V of the true final obs of episode 1
    terminated = torch.zeros(1, 3, 1, dtype=torch.bool)
    truncated = torch.tensor([False, True, False]).view(1, 3, 1)
    gamma, lmbda = 0.5, 1.0

    cut, _ = compute_gae(reward, terminated, truncated, value, next_value, gamma, lmbda, True)
    leak, _ = compute_gae(reward, terminated, truncated, value, next_value, gamma, lmbda, False)
    # δ = [1, 1 + 0.5·10, 5] = [1, 6, 5]
    assert cut.flatten().tolist() == pytest.approx([1 + 0.5 * 6, 6, 5])
    assert leak.flatten().tolist() == pytest.approx([1 + 0.5 * (6 + 0.5 * 5), 6 + 0.5 * 5, 5])


def test_termination_drops_the_bootstrap_and_cuts():
    reward = _one_env([1.0, 2.0, 3.0])
    value = _one_env([0.5, 0.5, 0.5])
    next_value = _one_env([4.0, 4.0, 4.0])
    terminated = torch.tensor([False, True, False]).view(1, 3, 1)
    truncated = torch.zeros(1, 3, 1, dtype=torch.bool)
    adv, ret = compute_gae(reward, terminated, truncated, value, next_value, 1.0, 1.0, False)
    # δ = [1 + 4 − 0.5, 2 − 0.5, 3 + 4 − 0.5]; A_1 does not see A_2
    assert adv.flatten().tolist() == pytest.approx([4.5 + 1.5, 1.5, 6.5])
    assert ret.flatten().tolist() == pytest.approx([6.5, 2.0, 7.0])


def test_gae_module_buffers():
    gae = GAE(0.99, 0.95)
    assert list(gae.state_dict()) == ["gamma", "lmbda"]
    assert gae.gamma.shape == () and gae.gamma.item() == pytest.approx(0.99)
