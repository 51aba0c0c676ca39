"""Hops that end at the goal (`env.navigation.reach_hold`): an episode ends as a time-out once the
drone has been within reach of its goal for k steps in a row; NavRL's rule otherwise."""

from __future__ import annotations

import pytest
import torch

from navrl_daemon.config import CurriculumStage, EnvConfig, PromotionRule, load_config
from navrl_daemon.env.backends import backend_of
from navrl_daemon.env.contract import STAT_KEYS
from navrl_daemon.env.navigation import REACH_RADIUS, NavigationEnv
from navrl_daemon.errors import ConfigError
from navrl_daemon.rl.evaluations import make_eval_env
from tests.conftest import navrl_cli

ACTION = ("agents", "action")
N = 8


def small(*overrides: str):
    return load_config(
        None,
        [
            "run.device=cpu",
            f"env.num_envs={N}",
            "env.field_size=20.0",
            "env.num_obstacles=0",
            "env.num_dynamic_obstacles=0",
            "env.max_episode_length=40",
            "eval.num_envs=4",
            *overrides,
        ],
        environ={},
    )


def hover_at_goals(env: NavigationEnv, steps: int) -> list:
    """Drones 0-3 start on their goal, 4-7 three metres off it; zero commands (they hold
    still); the step records of `steps` steps with auto-reset."""
    env.reset()
    goal = env.goal.clone()
    start = torch.where(torch.arange(N)[:, None] < 4, goal, goal + torch.tensor([3.0, 0, 0]))
    td = env.place_drones(start, goal)
    records = []
    for _ in range(steps):
        td.set(ACTION, torch.zeros(N, 1, 3))
        record, td = env.step_and_maybe_reset(td)
        records.append(record)
    return records


@pytest.mark.parametrize("mode", ["indexed", "masked"])
def test_an_episode_ends_as_a_time_out_after_k_steps_at_the_goal(mode: str):
    """k = 3: the drones on their goal end their episode at the third step, truncated (the
    value bootstraps), not terminated, with reach_goal 1, and move up a density level; the
    drones away from it fly on. Both auto-reset modes agree."""
    env = NavigationEnv(
        small(
            f"env.navigation.reset_mode={mode}",
            "env.navigation.reach_hold=3",
            "env.navigation.map_levels=[0]",
        ).env,
        seed=1,
    )
    records = hover_at_goals(env, 3)
    for step, record in enumerate(records[:2]):
        assert not record["next", "done"].any(), step
    last = records[2]["next"]
    at_goal = torch.arange(N) < 4
    assert torch.equal(last["truncated"].reshape(N), at_goal)
    assert not last["terminated"].any()
    stats = last["stats"]
    assert torch.equal(stats["reach_goal"].reshape(N), at_goal.float())
    assert torch.equal(stats["episode_len"].reshape(N), torch.full((N,), 3.0))
    assert env.held.tolist() == [0] * N  # new episodes where they ended; none near the rest
    # With two levels the finished hops move their envs up.
    env2 = NavigationEnv(
        small(
            f"env.navigation.reset_mode={mode}",
            "env.navigation.reach_hold=3",
            "env.num_obstacles=4",
            "env.navigation.map_levels=[0, 4]",
        ).env,
        seed=1,
    )
    hover_at_goals(env2, 3)
    assert env2.level.tolist() == [1, 1, 1, 1, 0, 0, 0, 0]


def test_without_reach_hold_a_drone_at_its_goal_hovers_to_the_time_out():
    env = NavigationEnv(small("env.max_episode_length=6").env, seed=1)
    records = hover_at_goals(env, 6)
    assert not any(r["next", "done"].any() for r in records[:5])
    last = records[5]["next"]
    assert last["truncated"].all()
    assert torch.equal(last["stats"]["reach_goal"].reshape(N), (torch.arange(N) < 4).float())
    assert env.held.tolist() == [0] * N  # not counted without the option


def test_the_count_is_of_steps_in_a_row():
    """Leaving the goal's radius starts the count again."""
    env = NavigationEnv(small("env.navigation.reach_hold=4").env, seed=1)
    records = hover_at_goals(env, 2)
    assert env.held.tolist() == [2] * 4 + [0] * 4
    env.pos[:4] = env.goal[:4] + torch.tensor([2 * REACH_RADIUS, 0, 0])  # pushed off
    td = records[-1]["next"].exclude("stats").clone()
    td.set(ACTION, torch.zeros(N, 1, 3))
    env.step(td)
    assert env.held.tolist() == [0] * N
    env.pos[:4] = env.goal[:4]
    for _ in range(3):
        env.step(td)
    assert env.held.tolist() == [3] * 4 + [0] * 4
    assert int(env.episode_stats[0, STAT_KEYS.index("truncated")]) == 0


def test_evaluations_keep_navrls_rule():
    cfg = small("env.navigation.reach_hold=5")
    assert make_eval_env(cfg, "cpu").cfg.navigation.reach_hold == 0


def test_a_curriculum_stage_can_end_its_hops_at_the_goal():
    stages = (
        '[{name = "hops", spawn = "local", reach_hold = 30, promote = {reach_goal = 0.6}},'
        ' {name = "navrl"}]'
    )
    cfg = small(f"env.curriculum={stages}")
    assert cfg.env.stage_env(0).navigation.reach_hold == 30
    assert cfg.env.stage_env(1).navigation.reach_hold == 0


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["env.navigation.reach_hold=-1"], "reach_hold"),
        (['env.curriculum=[{name = "x", reach_hold = -2}]'], "reach_hold"),
    ],
)
def test_bad_values_exit_78_naming_the_key(overrides: list[str], needle: str):
    proc = navrl_cli("config", "show", *overrides)
    assert proc.returncode == 78, proc.stderr
    assert needle in proc.stderr


def test_a_backend_that_ends_no_episode_at_the_goal_refuses_reach_hold():
    """The backends' registry says which backends end episodes at the goal: reach_hold, the
    section's or a stage's, for another one is exit 78 where the backend is resolved
    (`env check`, `run`), before its module is imported."""
    proc = navrl_cli("env", "check", "env.navigation.reach_hold=5", "env.backend=isaac")
    assert proc.returncode == 78, proc.stderr
    assert "env.navigation.reach_hold: backend 'isaac' does not end episodes" in proc.stderr
    stages = [
        CurriculumStage(name="hops", reach_hold=3, promote=PromotionRule()),
        CurriculumStage(),
    ]
    with pytest.raises(ConfigError, match="reach_hold"):
        backend_of(EnvConfig(backend="isaac", curriculum=stages))
    assert backend_of(EnvConfig().replaced(reach_hold=5, curriculum=stages)).reach_hold
