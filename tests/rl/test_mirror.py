"""`ppo.mirror`: the task's left-right reflection in the goal frame (rl/mirror.py), checked
against the env itself, and the update that trains on it."""

from __future__ import annotations

import copy

import pytest
import torch

from navrl_daemon.config import EnvConfig, PPOConfig
from navrl_daemon.env import make_env
from navrl_daemon.rl import ppo
from navrl_daemon.rl.mirror import (
    mirror_action,
    mirror_dynamic,
    mirror_lidar,
    mirror_state,
    with_mirror,
)
from navrl_daemon.rl.policy import NavRLPolicy
from tests.conftest import navrl_cli
from tests.env.test_map_levels import small

OBS = ("agents", "observation")
ACTION = ("agents", "action")
REWARD = ("agents", "reward")
FLIP_Y = torch.tensor([1.0, -1.0, 1.0])


def random_boxes(g: torch.Generator, count: int = 40) -> torch.Tensor:
    """Pillars [count, 5] (x0, y0, x1, y1, h) spread over a 20 m field."""
    corner = torch.rand(count, 2, generator=g) * 16.0 - 8.0
    side = 0.3 + 0.7 * torch.rand(count, 2, generator=g)
    height = 1.0 + 5.0 * torch.rand(count, 1, generator=g)
    return torch.cat((corner, corner + side, height), -1)


def reflected_boxes(boxes: torch.Tensor) -> torch.Tensor:
    """The same pillars reflected in the plane y = 0."""
    x0, y0, x1, y1, h = boxes.unbind(-1)
    return torch.stack((x0, -y1, x1, -y0, h), -1)


def twin_envs(num_envs: int, dynamic: int, g: torch.Generator):
    """An env in a random scene and one in its reflection in y = 0: pillars, drones, goals
    (and moving obstacles) reflected. Returns (env, twin, first obs, twin's first obs)."""
    cfg = EnvConfig().replaced(
        num_envs=num_envs,
        field_size=20.0,
        num_obstacles=0,
        num_dynamic_obstacles=dynamic,
        max_episode_length=200,
        spawn="local",
    )
    env, twin = make_env(cfg), make_env(cfg)
    boxes = random_boxes(g)
    env.set_pillars(boxes)
    twin.set_pillars(reflected_boxes(boxes))
    if dynamic:
        pos = torch.rand(env.dynamic.pos.shape, generator=g) * 6.0 - 3.0
        vel = torch.randn(env.dynamic.vel.shape, generator=g)
        env.dynamic.pos.copy_(pos)
        env.dynamic.vel.copy_(vel)
        twin.dynamic.pos.copy_(pos * FLIP_Y)
        twin.dynamic.vel.copy_(vel * FLIP_Y)
    start = torch.cat((torch.rand(num_envs, 2, generator=g) * 8 - 4, torch.ones(num_envs, 1)), -1)
    start[:, 2] += torch.rand(num_envs, generator=g)
    goal = start + torch.cat(
        (torch.randn(num_envs, 2, generator=g) * 6, torch.zeros(num_envs, 1)), -1
    )
    td = env.place_drones(start, goal)
    td_twin = twin.place_drones(start * FLIP_Y, goal * FLIP_Y)
    return env, twin, td, td_twin


def assert_reflected(obs, obs_twin) -> None:
    torch.testing.assert_close(obs_twin["state"], mirror_state(obs["state"]), atol=1e-5, rtol=0)
    torch.testing.assert_close(obs_twin["lidar"], mirror_lidar(obs["lidar"]), atol=1e-4, rtol=0)
    torch.testing.assert_close(
        obs_twin["dynamic_obstacle"], mirror_dynamic(obs["dynamic_obstacle"]), atol=1e-5, rtol=0
    )


def test_the_reflected_scene_observes_the_mirrored_observation_and_earns_the_same_reward():
    """Flights through a scene and through its reflection: at every step the twin's
    observation is the mirror of the flight's (state, every LiDAR beam) and its reward is
    the same. A wrong column map or sign fails here, against the env's own ray casts."""
    g = torch.Generator().manual_seed(0)
    env, twin, td, td_twin = twin_envs(16, 0, g)
    assert td[OBS]["lidar"].gt(0).any(), "no pillar within the LiDAR's range: a weak test"
    assert_reflected(td[OBS], td_twin[OBS])
    for _ in range(20):
        action = (torch.rand(16, 1, 3, generator=g) * 4 - 2) * torch.tensor([1.0, 1.0, 0.3])
        td.set(ACTION, action)
        td_twin.set(ACTION, action * FLIP_Y)
        out, out_twin = env.step(td)["next"], twin.step(td_twin)["next"]
        assert_reflected(out[OBS], out_twin[OBS])
        torch.testing.assert_close(out_twin[REWARD], out[REWARD], atol=1e-4, rtol=1e-5)
        assert torch.equal(out_twin["terminated"], out["terminated"])
        td, td_twin = out.clone(), out_twin.clone()


def test_moving_obstacles_are_mirrored_too():
    g = torch.Generator().manual_seed(1)
    _, _, td, td_twin = twin_envs(16, 16, g)
    assert td[OBS]["dynamic_obstacle"].ne(0).any(), "no moving obstacle in range: a weak test"
    assert_reflected(td[OBS], td_twin[OBS])


def test_the_mirrored_action_flies_the_mirrored_velocity():
    """The policy's world velocity of a mirrored action, in a goal frame reflected in
    y = 0, is the reflection of the original's."""
    g = torch.Generator().manual_seed(2)
    policy = NavRLPolicy()
    action = torch.rand(32, 3, generator=g)
    direction = torch.cat((torch.randn(32, 1, 2, generator=g), torch.zeros(32, 1, 1)), -1)
    world = policy.to_world(action, direction)
    mirrored = policy.to_world(mirror_action(action), direction * FLIP_Y)
    torch.testing.assert_close(mirrored, world * FLIP_Y)


def test_the_mirror_is_its_own_inverse():
    g = torch.Generator().manual_seed(3)
    state, lidar = torch.randn(8, 8, generator=g), torch.rand(8, 1, 36, 4, generator=g)
    dynamic, action = torch.randn(8, 1, 5, 10, generator=g), torch.rand(8, 3, generator=g)
    for f, x in ((mirror_state, state), (mirror_lidar, lidar), (mirror_dynamic, dynamic)):
        assert torch.equal(f(f(x)), x) and not torch.equal(f(x), x)
    torch.testing.assert_close(mirror_action(mirror_action(action)), action)
    # Column 0 looks at the goal and column 18 away from it: both stay.
    assert torch.equal(mirror_lidar(lidar)[..., [0, 18], :], lidar[..., [0, 18], :])


def test_the_update_trains_on_each_minibatch_and_its_mirror(make_batch):
    """With ppo.mirror the losses are those of the minibatch and its reflection together,
    which share advantage, target, value and behaviour log-prob; the values returned are
    the minibatch's own."""
    policy = NavRLPolicy()
    batch = make_batch(policy, 8, 4)
    advantages, targets = ppo.advantages_and_targets(copy.deepcopy(policy), batch, PPOConfig())
    mb = ppo.update_data(batch, advantages, targets).reshape(-1)
    inputs = ppo.loss_inputs(mb)
    on = PPOConfig(mirror=True)
    losses, value, kls = ppo.tensor_losses(policy, *inputs, 1e-3, on)
    want, both, _ = ppo.tensor_losses(policy, *with_mirror(*inputs), 1e-3, PPOConfig())
    assert list(losses) == list(want) == list(ppo.LOSS_TERMS)
    for name in ppo.LOSS_TERMS:
        torch.testing.assert_close(losses[name], want[name])
    torch.testing.assert_close(value, both[: mb.shape[0]])
    plain, _, plain_kls = ppo.tensor_losses(policy, *inputs, 1e-3, PPOConfig())
    assert not torch.equal(plain["actor_loss"], losses["actor_loss"])  # the reflection counts
    # The KL is the collected rows' (as without the mirror); the reflections' apart.
    torch.testing.assert_close(kls[0], plain_kls[0])
    assert float(plain_kls[1]) == 0.0 and float(kls[1]) > 0.0


def test_training_on_mirrors_makes_the_policy_more_symmetric(make_batch):
    """The same update with and without ppo.mirror, from the same weights (which act
    almost symmetrically): on its own rollout's observations, the policy's mean action on a
    mirrored observation strays less far from the mirror of its mean action with it.

    Not to zero: the network is not built symmetric, so what one row teaches it moves its
    action on the mirrored row too (here 0.61 of the plain update's asymmetry; 0.60-0.68
    over seeds 0-3 after three updates each)."""

    def asymmetry(policy: NavRLPolicy, obs) -> float:
        with torch.no_grad():
            a = policy.distribution(
                policy.features(obs["state"], obs["lidar"], obs["dynamic_obstacle"])
            ).mean
            m = policy.distribution(
                policy.features(
                    mirror_state(obs["state"]),
                    mirror_lidar(obs["lidar"]),
                    mirror_dynamic(obs["dynamic_obstacle"]),
                )
            ).mean
        return float((mirror_action(a) - m).abs().mean())

    torch.manual_seed(0)
    start = NavRLPolicy()
    batch = make_batch(start, 64, 8)
    obs = batch[OBS].reshape(-1)
    results = {}
    for mirror in (False, True):
        policy = copy.deepcopy(start)
        cfg = PPOConfig(mirror=mirror, epochs=8, minibatches=4)
        optimizers = ppo.make_optimizers(policy, cfg)
        ppo.update(policy, optimizers, batch, cfg, generator=torch.Generator().manual_seed(0))
        results[mirror] = asymmetry(policy, obs)
    assert results[True] < 0.8 * results[False], results


@pytest.mark.parametrize("value", ['"yes"', "2", "[true]"])
def test_a_mirror_that_is_not_a_boolean_is_a_config_error(value: str):
    proc = navrl_cli("config", "show", f"ppo.mirror={value}")
    assert proc.returncode == 78, proc.stderr
    assert "ppo.mirror" in proc.stderr


def test_a_config_with_the_mirror_loads():
    assert small("ppo.mirror=true").ppo.mirror is True
    assert small().ppo.mirror is False
