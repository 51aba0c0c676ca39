"""Evaluation off the hot path (issue #22): a captured evaluation step gives the numbers of
the op-by-op one. On the CPU the capture is `graphs.traced_capture` (the contract of a
CUDA graph through torch.fx); the CUDA cases run where there is a GPU."""

from __future__ import annotations

import pytest
import torch

from navrl_daemon.config import Config, load_config
from navrl_daemon.rl.evaluate import Evaluation, evaluate, evaluate_outcomes, evaluate_recorded
from navrl_daemon.rl.evaluations import make_eval_env
from navrl_daemon.rl.graphs import traced_capture
from navrl_daemon.rl.policy import make_policy
from navrl_daemon.testing import env_overrides
from navrl_daemon.testing.host_reads import HostData

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")


def eval_config(device: str = "cpu", layout: str = "navrl", **env) -> Config:
    overrides = {
        "num_envs": 16,
        "num_maps": 2,
        "field_size": 10.0,
        "num_obstacles": 40,
        "num_dynamic_obstacles": 16,
        "max_episode_length": 60,
        "dt": 0.1,
        "reset_mode": "masked",
        **env,
    }
    return load_config(
        None,
        [
            f"run.device={device}",
            "eval.num_envs=12",
            "eval.max_steps=70",
            f"eval.layout={layout}",
            *env_overrides(overrides),
        ],
        environ={},
    )


def nudged(policy, g: torch.Generator) -> dict[str, torch.Tensor]:
    return {
        k: v + 0.1 * torch.randn(v.shape, generator=g).to(v.device) if v.is_floating_point() else v
        for k, v in policy.state_dict().items()
    }


def test_a_captured_evaluation_gives_the_op_by_op_numbers() -> None:
    """Same env kind, seed and weights: the captured evaluation's numbers are the eager
    ones, again on a second call (the graph replayed, the env reseeded in place) and after
    new weights are loaded in place; the graph is captured once."""
    cfg = eval_config()
    torch.manual_seed(0)
    policy = make_policy(cfg, "cpu")
    captured = Evaluation(make_eval_env(cfg, "cpu"), seed=3, max_steps=70, capture=traced_capture)
    plain_env = make_eval_env(cfg, "cpu")
    g = torch.Generator().manual_seed(1)
    for round_ in range(3):
        if round_ == 2:
            policy.load_state_dict(nudged(policy, g))
        expected, outcomes = evaluate_outcomes(plain_env, policy, seed=3, max_steps=70)
        assert captured(policy) == expected, round_
        assert captured.outcomes() == outcomes, round_  # drone by drone, not only the means
    assert captured.captures == 1
    assert expected["episodes"] == 12


@pytest.mark.parametrize(
    ("layout", "env"),
    [
        ("navrl", {}),
        (
            "train",
            {
                "map_levels": [0, 10, 40],
                "reach_hold": 3,
                "spawn": "local",
                "goal_distance": [1.0, 4.0],
                "crossing_share": 0.5,
            },
        ),
    ],
    ids=["navrl_layout", "train_layout_levels_hops_hold"],
)
def test_a_captured_evaluation_makes_no_host_data_into_tensors(layout: str, env: dict) -> None:
    """What a CUDA graph refuses and the CPU's traced capture lets through: host data
    (`t[:, (2, 3)]`, `torch.tensor(...)`) copied to the device inside the step (its
    warm-up runs and capture; the env's reseed before them runs outside the graph)."""
    cfg = eval_config(layout=layout, **env)
    torch.manual_seed(0)
    policy = make_policy(cfg, "cpu")
    host = HostData()

    def watched_capture(step, *, warmup_runs, generators):
        with host:
            return traced_capture(step, warmup_runs=warmup_runs, generators=generators)

    captured = Evaluation(make_eval_env(cfg, "cpu"), seed=3, max_steps=70, capture=watched_capture)
    result = captured(policy)
    assert host.found == []
    assert captured.captures == 1 and result["episodes"] == 12


def test_the_captured_evaluation_goes_on_when_some_envs_never_finish() -> None:
    """Episodes longer than max_steps: the unfinished count and their stats so far."""
    cfg = eval_config(max_episode_length=500, num_obstacles=0, num_dynamic_obstacles=0)
    torch.manual_seed(0)
    policy = make_policy(cfg, "cpu")
    captured = Evaluation(make_eval_env(cfg, "cpu"), seed=0, max_steps=20, capture=traced_capture)
    expected = evaluate(make_eval_env(cfg, "cpu"), policy, seed=0, max_steps=20)
    assert captured(policy) == expected
    assert expected["unfinished"] > 0
    # a drone still flying at the step cap is neither reached nor collided: timed out
    assert captured.outcomes().count("T") >= expected["unfinished"]


def test_evaluations_are_captured_where_rollouts_are() -> None:
    cpu = Evaluation.for_env(make_eval_env(eval_config(), "cpu"), seed=0, max_steps=5)
    assert cpu.capture is None and cpu.stream is None


@CUDA
def test_cuda_graph_evaluation_matches_eager_on_its_own_stream() -> None:
    cfg = eval_config("cuda", reset_mode="auto")
    torch.manual_seed(0)
    policy = make_policy(cfg, "cuda")
    captured = Evaluation.for_env(make_eval_env(cfg, "cuda"), seed=3, max_steps=70)
    assert captured.capture is not None and captured.stream is not None
    eager_cfg = eval_config("cuda", collect_path="eager")
    eager = Evaluation.for_env(make_eval_env(eager_cfg, "cuda"), seed=3, max_steps=70)
    assert eager.capture is None
    for _ in range(2):
        got, want = captured(policy), eager(policy)
        assert got.keys() == want.keys()
        for key in want:
            assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-4), key
        assert captured.outcomes() == eager.outcomes()  # read on the capture's own stream
    assert captured.captures == 1 and captured.capture_error is None


def test_episodes_that_leave_the_height_band_are_counted_as_out_of_bounds() -> None:
    """A policy that climbs at full speed ends every episode above 4 m: no collision, no
    time-out, so NavRL's stats alone would show nothing; `out_of_bounds` says 1. The
    untrained policy (zero velocity) times out, 0."""
    cfg = eval_config(max_episode_length=200, num_obstacles=0, num_dynamic_obstacles=0)
    torch.manual_seed(0)
    policy = make_policy(cfg, "cpu")
    env = make_eval_env(cfg, "cpu")
    hovering = evaluate(env, policy, seed=0, max_steps=200)
    assert hovering["truncated"] == 1.0 and hovering["out_of_bounds"] == 0.0
    with torch.no_grad():  # Beta mean of the z axis → 1: +2 m/s upwards
        policy.beta_head.alpha_layer.bias[2] = 20.0
        policy.beta_head.beta_layer.bias[2] = -20.0
    climbing = evaluate(env, policy, seed=0, max_steps=200)
    assert climbing["out_of_bounds"] == 1.0
    assert climbing["collision"] == 0.0 and climbing["truncated"] == 0.0
    assert climbing["unfinished"] == 0 and climbing["episode_len"] < 40
    recorded, traj = evaluate_recorded(env, policy, seed=0, max_steps=200)
    assert recorded == climbing
    assert traj.outcomes() == ["out of bounds"] * 12  # plots, videos, probes, `eval`
    assert traj.codes() == "O" * 12
