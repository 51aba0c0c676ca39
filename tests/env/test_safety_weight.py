"""`env.navigation.safety_weight`: the weight of the reward's clearance terms (ours; NavRL: 1.0)."""

from __future__ import annotations

import math

import pytest
import torch

from navrl_daemon.config import EnvConfig
from navrl_daemon.env import NavigationEnv, make_env
from navrl_daemon.rl.eval_config import evaluation_key
from navrl_daemon.rl.evaluations import Evaluations
from navrl_daemon.rl.policy import NavRLPolicy
from tests.conftest import navrl_cli
from tests.env.test_map_levels import small

ACTION = ("agents", "action")
REWARD = ("agents", "reward")


def one_step_rewards(weight: float, *, dynamic: bool) -> torch.Tensor:
    """Rewards of one step from the same state: 4 drones at 0.6-3 m from a pillar (and,
    with `dynamic`, beside moving obstacles, frozen in place)."""
    cfg = EnvConfig().replaced(
        num_envs=4,
        field_size=10.0,
        num_obstacles=0,
        num_dynamic_obstacles=8 if dynamic else 0,
        max_episode_length=100,
        spawn="local",
        safety_weight=weight,
    )
    env = make_env(cfg)
    env.set_pillars(torch.tensor([[2.0, -0.5, 3.0, 0.5, 4.0]]))
    if dynamic:
        env.dynamic.pos[:] = 100.0
        env.dynamic.pos[0, 2] = torch.tensor([0.0, 1.5, 1.0])
        env.dynamic.vel.zero_()
    start = torch.tensor([[x, 0.0, 1.0] for x in (-1.0, 0.0, 1.0, 1.4)])
    goal = torch.tensor([[4.0, 3.0, 1.0]] * 4)
    td = env.place_drones(start, goal)
    td.set(ACTION, torch.tensor([0.5, 0.2, 0.0]).expand(4, 1, 3).clone())
    return env.step(td)["next", *REWARD][:, 0]


@pytest.mark.parametrize("dynamic", [False, True], ids=["pillars", "moving-obstacles"])
def test_the_weight_scales_the_clearance_terms_and_nothing_else(dynamic: bool):
    """r(w) = r(0) + w * safety: the weight's steps change the reward by equal amounts,
    and the terms are lower the nearer the pillar (all below ln 4 per beam)."""
    r0, r1, r3 = (one_step_rewards(w, dynamic=dynamic) for w in (0.0, 1.0, 3.0))
    safety = r1 - r0
    torch.testing.assert_close(r3 - r1, 2 * safety)
    most = math.log(4.0) * (2 if dynamic else 1)
    assert torch.all(safety < most) and torch.all(safety > 0)
    assert torch.all(safety[1:] < safety[:-1])  # nearer the pillar: less clearance paid


def test_the_default_weight_is_navrl_reward_bit_for_bit():
    """At 1.0 the reward is NavRL's sum of terms (navrl-task §1.8), each term added as it
    is, not within rounding: the same states give the same floats."""
    env = make_env(
        EnvConfig().replaced(num_envs=64, num_obstacles=40, field_size=10.0, spawn="local")
    )
    g = torch.Generator().manual_seed(0)
    td = env.reset()
    for _ in range(5):  # somewhere among the pillars, moving
        td.set(ACTION, torch.rand(64, 1, 3, generator=g))
        td = env.step(td)["next"].clone()
    to_goal = env.goal - env.pos
    dist = to_goal.norm(dim=-1)
    dyn = torch.rand(64, 5, generator=g) * 5
    toward = to_goal / dist.clamp_min(1e-6)[:, None]
    want = (env.vel * toward).sum(-1) + 1.0
    want = want + torch.log(env.scan.clamp(1e-6, 4.0)).mean(-1)
    want = want + torch.log(dyn.clamp(1e-6, 4.0)).mean(-1)
    want = want - 0.1 * (env.vel - env.prev_vel).norm(dim=-1)
    z = env.pos[:, 2]
    above = (z - (env.height_range[:, 1] + 0.2)).clamp_min(0)
    below = ((env.height_range[:, 0] - 0.2) - z).clamp_min(0)
    want = want - 8.0 * (above * above + below * below)
    assert torch.equal(env._reward(to_goal, dist, dyn), want)


def test_evaluations_fly_navrl_reward_whatever_the_weight():
    """An evaluation's returns are NavRL's, so runs with other weights compare, and a
    stage with another weight still evaluates the target env."""
    torch.manual_seed(0)
    policy = NavRLPolicy()
    heavy = small("env.navigation.safety_weight=3.0")
    assert Evaluations(heavy, "cpu")(policy) == Evaluations(small(), "cpu")(policy)
    assert evaluation_key(heavy) == evaluation_key(small())
    env = NavigationEnv(heavy.env, seed=0)
    assert env.safety_weight == 3.0


def test_a_curriculum_stage_sets_the_weight():
    stage = '{name = "careful", safety_weight = 2.5, promote = {reach_goal = 0.5}}'
    cfg = small(f'env.curriculum=[{stage}, {{name = "navrl"}}]')
    assert cfg.env.stage_env(0).navigation.safety_weight == 2.5
    assert cfg.env.stage_env(1).navigation.safety_weight == 1.0


@pytest.mark.parametrize(
    "overrides",
    [
        ["env.navigation.safety_weight=-1"],
        ["env.navigation.safety_weight=101"],
        ["env.navigation.safety_weight=nan"],
        ["env.curriculum=[{safety_weight = -0.5}]"],
    ],
)
def test_bad_weights_exit_78_naming_the_key(overrides: list[str]):
    proc = navrl_cli("config", "show", *overrides)
    assert proc.returncode == 78, proc.stderr
    assert "safety_weight" in proc.stderr
