"""What a captured env step needs from the env: state at fixed addresses, no branch on the
step number, and the same statistics as NavRL's draws (issue #22)."""

from __future__ import annotations

import math

import pytest
import torch

from navrl_daemon.config import EnvConfig
from navrl_daemon.env import NavigationEnv, make_env
from navrl_daemon.env.navigation.obstacles import DynamicObstacles, place_dynamic_origins
from navrl_daemon.rl.graphs import traced_capture

ACTION = ("agents", "action")


def config(**overrides) -> EnvConfig:
    base = {
        "num_envs": 16,
        "field_size": 10.0,
        "num_obstacles": 30,
        "num_dynamic_obstacles": 16,
        "max_episode_length": 12,
        "num_maps": 2,
        "spawn_margin": 0.0,
    }
    return EnvConfig().replaced(**{**base, **overrides})


def addresses(env: NavigationEnv) -> dict[str, int]:
    return {name: t.untyped_storage().data_ptr() for name, t in env.state_tensors().items()}


@pytest.mark.parametrize(
    ("levels", "hold"),
    [([], 0), ([0, 10, 30], 0), ([0, 10, 30], 2)],
    ids=["whole_map", "map_levels", "reach_hold"],
)
@pytest.mark.parametrize("mode", ["indexed", "masked"])
def test_every_state_tensor_keeps_its_storage(mode: str, levels: list[int], hold: int) -> None:
    """Steps with crashes and time-outs, auto-resets, full resets, reseeds, a state load
    and scripted starts: every tensor a step reads or writes stays where it was (the
    density levels too, which move at every ended episode, and the counts of steps at
    the goal, env.navigation.reach_hold)."""
    env = make_env(config(reset_mode=mode, map_levels=levels, reach_hold=hold), seed=2)
    env.level.fill_(len(env.level_counts) - 1)  # at the top: collisions move levels down
    state = env.state_tensors()
    # Everything a checkpoint saves of the env is listed (the stats as one [N, 5] tensor).
    saved = {"episode_stats" if k.startswith("stats.") else k for k in env.state_dict_env()}
    assert saved - {"generator"} == set(state)
    where = addresses(env)
    g = torch.Generator().manual_seed(0)
    td = env.reset()
    dones = 0
    for step in range(40):
        td.set(ACTION, torch.rand(16, 1, 3, generator=g) * 4 - 2)
        record, td = env.step_and_maybe_reset(td)
        dones += int(record["next", "done"].sum())
        if step == 15:
            saved_state = env.state_dict_env()
        if step == 20:
            env.set_seed(5)
            td = env.reset()
        if step == 25:
            env.load_state_dict_env(saved_state)
        if step == 30:
            td = env.place_drones(env.goal.clone(), env.start.clone())
        assert addresses(env) == where, step
    assert dones >= 16  # resets happened
    if levels:
        assert int(env.level.min()) < len(levels) - 1  # levels moved, in place


def test_load_state_dict_env_keeps_storage_and_restores() -> None:
    env = make_env(config(reset_mode="masked"), seed=1)
    td = env.reset()
    td.set(ACTION, torch.ones(16, 1, 3))
    env.step_and_maybe_reset(td)
    state = env.state_dict_env()
    where = addresses(env)
    env.step_and_maybe_reset(td)
    env.load_state_dict_env(state)
    assert addresses(env) == where
    for name, value in env.state_dict_env().items():
        assert torch.equal(value, state[name]), name


def test_dynamic_obstacles_replay_right_at_every_step_number() -> None:
    """The obstacles' step captured once (at a step that does not re-aim) and replayed
    across several re-aims equals the step run eagerly: the re-aim period is decided on
    the device, not by a Python branch a capture would freeze."""
    gen = torch.Generator().manual_seed(0)
    origin = place_dynamic_origins(2, 16, 10.0, gen)
    eager = DynamicObstacles(origin, 10.0, 0.25, (0.5, 1.5))  # re-aims every 8 steps
    replayed = DynamicObstacles(origin.clone(), 10.0, 0.25, (0.5, 1.5))
    g_eager, g_replayed = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    replay = traced_capture(lambda: replayed.step(g_replayed), warmup_runs=2)
    for _ in range(2):
        eager.step(g_eager)
    for step in range(30):
        eager.step(g_eager)
        replay()
        for name in ("pos", "goal", "vel", "step_count"):
            assert torch.equal(getattr(replayed, name), getattr(eager, name)), (name, step)
    assert int(eager.step_count) == 32


def _ks_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """Two-sample Kolmogorov-Smirnov statistic of 1-D samples."""
    a, b = a.double().sort().values, b.double().sort().values
    grid = torch.cat((a, b))
    cdf_a = torch.searchsorted(a, grid, right=True).double() / a.numel()
    cdf_b = torch.searchsorted(b, grid, right=True).double() / b.numel()
    return float((cdf_a - cdf_b).abs().max())


def _ks_critical(n: int, m: int, alpha: float = 0.001) -> float:
    return math.sqrt(-math.log(alpha / 2) / 2) * math.sqrt((n + m) / (n * m))


def _reference_speeds(obs: DynamicObstacles, gen: torch.Generator, steps: int) -> torch.Tensor:
    """Speeds at each re-aim under the draw rule before issue #22 (a speed is drawn only at
    a re-aim step), written out here as the reference."""
    speeds = []
    lo, hi = obs.speed_range
    for step in range(steps):
        if step % obs.retarget_period == 0:
            speeds.append(lo + (hi - lo) * torch.rand(obs.pos.shape[:-1], generator=gen))
    return torch.cat([s.flatten() for s in speeds])


def test_obstacle_speeds_keep_navrls_distribution() -> None:
    """Drawing every step and keeping the draw only at a re-aim leaves the speeds
    U(speed_range), re-aimed every period and constant between: the same law as drawing
    only at the re-aim (two-sample KS against that rule, and against the uniform)."""
    gen = torch.Generator().manual_seed(0)
    obs = DynamicObstacles(place_dynamic_origins(4, 80, 40.0, gen), 40.0, 0.1, (0.5, 1.5))
    period, speeds, steps = obs.retarget_period, [], 20 * obs.retarget_period
    for step in range(steps):
        before = obs.vel.clone()
        obs.step(gen)
        speed = obs.vel.norm(dim=-1)
        if step % period == 0:
            speeds.append(speed.flatten())
        else:
            assert torch.equal(obs.vel, before), step  # no re-aim between
    ours = torch.cat(speeds)
    assert ours.min() >= 0.5 - 1e-5 and ours.max() <= 1.5 + 1e-5
    reference = _reference_speeds(obs, torch.Generator().manual_seed(7), steps)
    assert ours.numel() == reference.numel() == 20 * 4 * 80
    critical = _ks_critical(ours.numel(), reference.numel())
    assert _ks_distance(ours, reference) < critical
    uniform = 0.5 + torch.rand(100_000, generator=torch.Generator().manual_seed(9))
    assert _ks_distance(ours, uniform) < _ks_critical(ours.numel(), uniform.numel())


def test_spawn_distribution_is_navrls_in_both_reset_modes() -> None:
    """Border spawns of every reset in a run (masked: drawn for all envs every step, kept
    where an episode ended): sides equally likely, uniform along the side."""
    env = make_env(config(num_envs=64, reset_mode="masked", max_episode_length=3), seed=3)
    side_len = env.cfg.field_size / 2 + env.cfg.spawn_margin
    td = env.reset()
    starts = []
    for _ in range(60):
        td.set(ACTION, torch.zeros(64, 1, 3))
        record, td = env.step_and_maybe_reset(td)
        done = record["next", "done"].squeeze(-1)
        starts.append(env.start[done])
    start = torch.cat(starts)
    assert start.shape[0] >= 64 * 15
    on_x = (start[:, 0].abs() - side_len).abs() < 1e-5
    on_y = (start[:, 1].abs() - side_len).abs() < 1e-5
    sides = torch.stack(
        (
            on_y & (start[:, 1] > 0),
            on_y & (start[:, 1] < 0),
            on_x & (start[:, 0] > 0),
            on_x & (start[:, 0] < 0),
        )
    )
    counts = sides.sum(1).double()
    expected = start.shape[0] / 4
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 16.27  # chi-square, 3 degrees of freedom, p = 0.001
    along = torch.where(on_y, start[:, 0], start[:, 1])
    uniform = (2 * torch.rand(50_000, generator=torch.Generator().manual_seed(4)) - 1) * side_len
    assert _ks_distance(along, uniform) < _ks_critical(along.numel(), uniform.numel())
