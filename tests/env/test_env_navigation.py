"""The TorchRL navigation env: specs, episodes, reward, collisions, determinism, resume."""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict
from torchrl.envs.utils import check_env_specs

from navrl_daemon.config import EnvConfig
from navrl_daemon.env import NavigationEnv, make_env

OBS = ("agents", "observation")
ACTION = ("agents", "action")


def config(**overrides) -> EnvConfig:
    base = {
        "num_envs": 8,
        "field_size": 10.0,
        "num_obstacles": 0,
        "num_dynamic_obstacles": 0,
        "max_episode_length": 100,
        "spawn": "local",
    }
    return EnvConfig().replaced(**{**base, **overrides})


def with_action(td: TensorDict, action: torch.Tensor) -> TensorDict:
    td.set(ACTION, action.reshape(td.batch_size[0], 1, 3))
    return td


def test_specs_at_navrl_scale():
    env = make_env(EnvConfig(), num_envs=6)
    check_env_specs(env)
    td = env.reset()
    assert td[OBS, "state"].shape == (6, 8)
    assert td[OBS, "lidar"].shape == (6, 1, 36, 4)
    assert td[OBS, "direction"].shape == (6, 1, 3)
    assert td[OBS, "dynamic_obstacle"].shape == (6, 1, 5, 10)
    assert all(v.dtype == torch.float32 for v in td[OBS].values())
    assert env.full_action_spec[ACTION].shape == (6, 1, 3)
    assert env.full_reward_spec["agents", "reward"].shape == (6, 1)
    for k in ("done", "terminated", "truncated"):
        assert env.full_done_spec[k].shape == (6, 1) and env.full_done_spec[k].dtype == torch.bool


def test_rollout_with_auto_reset_reports_stats():
    env = make_env(config(max_episode_length=10, num_dynamic_obstacles=8, num_obstacles=5))
    g = torch.Generator().manual_seed(0)

    def policy(td):
        return with_action(td, torch.rand(8, 3, generator=g) * 4 - 2)

    out = env.rollout(25, policy, auto_reset=True, break_when_any_done=False)
    assert out.batch_size == (8, 25)
    stats = out["next", "stats"]
    assert set(stats.keys()) == {"return", "episode_len", "reach_goal", "collision", "truncated"}
    assert stats["episode_len"].max() <= 10
    done = out["next", "done"]
    assert done.any()
    # Episode length counts up from 1 and restarts after each end.
    length = stats["episode_len"][..., 0]
    assert torch.all(length[:, 0] == 1)


def test_zero_dynamic_obstacles_give_zero_features():
    env = make_env(config())
    td = env.reset()
    td, _ = env.step_and_maybe_reset(with_action(td, torch.ones(8, 3)))
    assert td["next", *OBS, "dynamic_obstacle"].shape == (8, 1, 5, 10)
    assert torch.all(td["next", *OBS, "dynamic_obstacle"] == 0)


def place(env: NavigationEnv, start, goal) -> TensorDict:
    n = env.num_envs
    return env.place_drones(torch.tensor([start] * n), torch.tensor([goal] * n))


def test_flying_into_a_pillar_terminates_with_collision():
    env = make_env(config(num_envs=2))
    env.set_pillars(torch.tensor([[2.0, -0.5, 3.0, 0.5, 4.0]]))
    td = place(env, [0.0, 0.0, 1.0], [4.0, 0.0, 1.0])
    assert td[OBS, "lidar"][0, 0, 0, 1] == pytest.approx(2.0, abs=1e-5)  # 4 - 2 m
    steps = 0
    while steps < 200:
        td = env.step(with_action(td, torch.tensor([1.5, 0.0, 0.0]).expand(2, 3)))
        steps += 1
        if td["next", "done"].all():
            break
        td = td["next"].clone()
    nxt = td["next"]
    assert nxt["terminated"].all() and not nxt["truncated"].any()
    assert torch.all(nxt["stats", "collision"] == 1)
    assert torch.all(nxt["stats", "episode_len"] == steps)
    assert torch.all(nxt[OBS, "lidar"].amax((-1, -2, -3)) > 3.7)
    x = env.pos[:, 0]
    assert torch.all((x > 1.6) & (x < 1.75))  # stopped at 0.3 m from the face


def test_dynamic_obstacle_features_and_collision():
    env = make_env(config(num_envs=1, num_dynamic_obstacles=8))
    dyn = env.dynamic
    dyn.pos[:] = 100.0  # all far away...
    dyn.pos[0, 2] = torch.tensor([1.0, 1.0, 1.5])  # cuboid, 0.75 m wide, 1 m high
    dyn.pos[0, 6] = torch.tensor([-2.0, 0.0, 2.5])  # cylinder, 0.75 m wide
    dyn.vel[0, 2] = torch.tensor([0.5, 0.0, 0.0])
    td = place(env, [0.0, 0.0, 1.0], [5.0, 0.0, 1.0])
    feats = td[OBS, "dynamic_obstacle"][0, 0]
    want_cuboid = [1 / 1.5, 1 / 1.5, 0.5 / 1.5, math.sqrt(2), 0.5, 0.5, 0.0, 0.0, 2.0, 1.0]
    want_cylinder = [-1.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0, 2.0, 0.0]  # rel_z := 0
    torch.testing.assert_close(feats[0], torch.tensor(want_cuboid))
    torch.testing.assert_close(feats[1], torch.tensor(want_cylinder))
    assert torch.all(feats[2:] == 0)  # beyond 4 m: masked
    # Now put the cuboid within 0.3 m of its surface: a dynamic collision.
    dyn.pos[0, 2] = torch.tensor([0.4, 0.0, 1.5])
    td = env.step(with_action(td, torch.zeros(1, 3)))
    assert td["next", "terminated"].all() and td["next", "stats", "collision"].item() == 1


def test_reward_terms_by_hand():
    env = make_env(config(num_envs=1))
    td = place(env, [0.0, 0.0, 1.0], [5.0, 0.0, 1.0])
    td = env.step(with_action(td, torch.tensor([[1.0, 0.0, 0.0]])))
    v = 0.016 / 0.45  # first-order lag after one step
    static = math.log(4.0)  # nothing within range (ground at 5.8 m on the -10° beams)
    want = v + 1.0 + static - 0.1 * v
    assert td["next", "agents", "reward"].item() == pytest.approx(want, abs=1e-5)
    # Height penalty: 0.3 m above the [1, 1] band + 0.2 m margin.
    env_h = make_env(config(num_envs=1, smoothness_penalty=False))
    td = place(env_h, [0.0, 0.0, 1.0], [5.0, 0.0, 1.0])
    env_h.pos[:, 2] = 1.5
    td = env_h.step(with_action(td, torch.zeros(1, 3)))
    want = 1.0 + static - 8.0 * 0.3**2
    assert td["next", "agents", "reward"].item() == pytest.approx(want, abs=1e-4)


def test_state_observation_in_the_goal_frame():
    env = make_env(config(num_envs=1))
    td = place(env, [0.0, 0.0, 1.0], [0.0, 3.0, 2.0])  # goal along +y: yaw 90°
    state = td[OBS, "state"][0]
    torch.testing.assert_close(state[:3], torch.tensor([3.0, 0.0, 1.0]) / math.sqrt(10))
    assert state[3].item() == pytest.approx(3.0) and state[4].item() == pytest.approx(1.0)
    torch.testing.assert_close(td[OBS, "direction"][0, 0], torch.tensor([0.0, 3.0, 0.0]))
    td = env.step(with_action(td, torch.tensor([[0.0, 1.0, 0.0]])))
    v_g = td["next", *OBS, "state"][0, 5:]
    assert v_g[0] > 0 and abs(v_g[1]) < 1e-6  # flying towards the goal = +x in the goal frame


def test_truncation_and_reach_goal_stats():
    env = make_env(config(num_envs=2, max_episode_length=5))
    td = place(env, [0.0, 0.0, 1.0], [0.2, 0.0, 1.0])  # already within 0.5 m
    for _ in range(5):
        td = env.step(with_action(td, torch.zeros(2, 3)))
        td = td["next"].clone() if not td["next", "done"].any() else td
    nxt = td["next"]
    assert nxt["truncated"].all() and not nxt["terminated"].any()
    assert torch.all(nxt["stats", "truncated"] == 1) and torch.all(nxt["stats", "reach_goal"] == 1)
    assert torch.all(nxt["stats", "episode_len"] == 5)


def test_partial_reset_respawns_only_done_envs():
    env = make_env(config(num_envs=4))
    env.set_pillars(torch.tensor([[-0.5, -0.5, 0.5, 0.5, 3.0]]))
    td = env.reset()
    starts = torch.tensor([[0.0, 0.0, 1.0], [3.0, 3.0, 1.0], [-3.0, 3.0, 1.0], [3.0, -3.0, 1.0]])
    td = env.place_drones(starts, starts + torch.tensor([1.0, 0.0, 0.0]))
    before = env.pos.clone()
    _, td_next = env.step_and_maybe_reset(with_action(td, torch.zeros(4, 3)))
    assert torch.all(env.step_count == torch.tensor([0, 1, 1, 1]))  # env 0 (in the box) reset
    assert not torch.allclose(env.pos[0], before[0])
    torch.testing.assert_close(env.pos[1:], before[1:], atol=1e-3, rtol=0)
    assert td_next["stats", "episode_len"][:, 0].tolist() == [0.0, 1.0, 1.0, 1.0]
    assert not td_next["done"].any()


def test_navrl_layout():
    env = make_env(EnvConfig(num_obstacles=0, num_dynamic_obstacles=0), num_envs=5, layout="navrl")
    env.reset()
    torch.testing.assert_close(env.start[:, 0], torch.tensor([-16.0, -9.6, -3.2, 3.2, 9.6]))
    torch.testing.assert_close(env.goal[:, 0], torch.tensor([-16.0, -8.0, 0.0, 8.0, 16.0]))
    assert torch.all(env.start[:, 1] == 24.0) and torch.all(env.goal[:, 1] == -24.0)
    assert torch.all(env.start[:, 2] == 2.0) and torch.all(env.goal[:, 2] == 2.0)


def test_border_spawns_on_the_square():
    env = make_env(
        EnvConfig().replaced(num_obstacles=0, num_dynamic_obstacles=0, spawn="border"), num_envs=256
    )
    env.reset()
    for p in (env.start, env.goal):
        on_side = (p[:, :2].abs() == 24.0).any(-1) & (p[:, :2].abs() <= 24.0).all(-1)
        assert on_side.all()
        assert torch.all((p[:, 2] >= 0.5) & (p[:, 2] <= 2.5))
    d = env.goal - env.start
    torch.testing.assert_close(env.yaw, torch.atan2(d[:, 1], d[:, 0]))
    assert torch.all(env.vel == 0)


def test_local_spawns_clear_pillars():
    env = make_env(config(num_envs=256, num_obstacles=30))
    env.reset()
    horizontal = (env.goal - env.start)[:, :2].norm(dim=-1)
    assert torch.all(horizontal <= 4.0 + 1e-5) and torch.all(env.start[:, :2].abs() <= 5.0)
    assert torch.all(env.goal[:, :2].abs() <= 5.0)
    clear = env._pillar_clearance(torch.cat((env.start, env.goal)), env.map_id.repeat(2))
    assert (clear > 0.5).float().mean() > 0.99


def test_same_map_whatever_num_envs_or_layout():
    cfg = config(num_obstacles=40, num_dynamic_obstacles=16, num_maps=2)
    a = make_env(cfg, seed=3, num_envs=4)
    b = make_env(cfg, seed=3, num_envs=7, layout="navrl")
    c = make_env(cfg, seed=4, num_envs=4)
    assert torch.equal(a.lidar.grid.boxes, b.lidar.grid.boxes)
    assert torch.equal(a.dynamic.origin, b.dynamic.origin)
    assert not torch.equal(a.dynamic.origin, c.dynamic.origin)
    assert a.map_id.tolist() == [0, 1, 0, 1]


def run(env: NavigationEnv, steps: int, action_seed: int = 0) -> list[TensorDict]:
    g = torch.Generator().manual_seed(action_seed)
    td = env.reset()
    out = []
    for _ in range(steps):
        step, td = env.step_and_maybe_reset(
            with_action(td, torch.rand(env.num_envs, 3, generator=g) * 4 - 2)
        )
        out.append(step.clone())
    return out


def rollout_config() -> EnvConfig:
    return config(num_obstacles=30, num_dynamic_obstacles=16, max_episode_length=15, num_maps=2)


def test_same_seed_identical_rollouts():
    a = run(make_env(rollout_config(), seed=5), 40)
    b = run(make_env(rollout_config(), seed=5), 40)
    for x, y in zip(a, b, strict=True):
        assert (x == y).all()
    c = run(make_env(rollout_config(), seed=6), 40)
    assert not all((x == y).all() for x, y in zip(a, c, strict=True))


def test_set_seed_reseeds_step_randomness():
    env = make_env(rollout_config(), seed=5)
    env.set_seed(11)
    first = env.reset()
    env.set_seed(11)
    again = env.reset()
    assert (first == again).all()


def test_save_and_load_resume_exactly():
    env = make_env(rollout_config(), seed=2)
    g = torch.Generator().manual_seed(9)
    actions = torch.rand(40, 8, 3, generator=g) * 4 - 2
    td = env.reset()
    for t in range(10):
        _, td = env.step_and_maybe_reset(with_action(td, actions[t]))
    saved, saved_td = env.state_dict_env(), td.clone()

    def play(td):
        out = []
        for t in range(10, 40):  # crosses episode ends: resets draw from the generator
            step, td = env.step_and_maybe_reset(with_action(td, actions[t]))
            out.append(step.clone())
        return out

    first = play(td)
    env.load_state_dict_env(saved)
    second = play(saved_td)
    for x, y in zip(first, second, strict=True):
        assert (x == y).all()
    fresh = make_env(rollout_config(), seed=2)  # a new process restoring the same state
    fresh.load_state_dict_env(saved)
    td = saved_td.clone()
    for t in range(10, 40):
        step, td = fresh.step_and_maybe_reset(with_action(td, actions[t]))
        assert (step == first[t - 10]).all()


def test_crossing_spawns_put_the_goal_on_the_opposite_side():
    cfg = EnvConfig().replaced(num_obstacles=0, num_dynamic_obstacles=0, spawn="crossing")
    env = make_env(cfg, num_envs=512)
    env.reset()
    s = 24.0
    start, goal = env.start[:, :2], env.goal[:, :2]
    on_y = start[:, 1].abs() == s  # the start's side is a y side (else an x side)
    assert torch.all(torch.where(on_y, start[:, 1], start[:, 0]).abs() == s)
    torch.testing.assert_close(
        torch.where(on_y, goal[:, 1], goal[:, 0]), -torch.where(on_y, start[:, 1], start[:, 0])
    )
    assert 0.4 < on_y.float().mean() < 0.6  # both axes, about equally
    assert torch.all(torch.where(on_y, goal[:, 0], goal[:, 1]).abs() <= s)
    assert start[:, 0].std() > 5 and goal[:, 0][on_y].std() > 5  # uniform along the side
    assert torch.all((env.start[:, 2] >= 0.5) & (env.start[:, 2] <= 2.5))
