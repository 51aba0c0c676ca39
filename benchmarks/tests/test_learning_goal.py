"""benchmarks/learning.py's issue-#13 verdict: which evaluations count and when."""

from __future__ import annotations

import learning
import torch

from navrl_daemon.config import Config, load_config
from navrl_daemon.rl.evaluations import make_eval_env
from navrl_daemon.testing import TINY

NAVRL = {"reach_goal": 0.5625, "collision": 0.4375}


def row(frames: int, seconds: float, reach: float, collision: float, stage: int | None = None):
    r = {"frames": frames, "seconds": seconds, "reach_goal": reach, "collision": collision}
    return r if stage is None else {**r, "curriculum_stage": stage}


def check(curve, final=None, targets=None, final_s=600.0):
    return learning.goal_check(
        curve, final, NAVRL, targets=targets, within_s=480.0, final_s=final_s
    )


def test_only_evaluations_at_a_target_stage_count() -> None:
    curve = [row(0, 0, 0.0, 0.0, 0), row(10, 60, 0.9, 0.1, 0), row(20, 300, 0.6, 0.4, 2)]
    goal = check(curve, targets={2})
    assert goal["target_stage_evals"] == 1
    assert goal["first_eval_at_bar"] == row(20, 300, 0.6, 0.4)
    assert goal["met"]


def test_both_bounds_are_inclusive_and_both_are_needed() -> None:
    assert check([row(1, 10, 0.5625, 0.4375)])["met"]
    assert not check([row(1, 10, 0.57, 0.44)])["met"]  # more collisions
    assert not check([row(1, 10, 0.56, 0.10)])["met"]  # fewer goals reached


def test_too_late_is_not_met_but_is_reported() -> None:
    goal = check([row(1, 500, 0.9, 0.0)])
    assert goal["first_eval_at_bar"]["seconds"] == 500 and not goal["met"]


def test_the_final_export_counts_when_the_run_stopped_in_time() -> None:
    final = {"frames": 5, "reach_goal": 0.7, "collision": 0.2}
    assert check([row(1, 10, 0.1, 0.9)], final, final_s=470.0)["met"]
    goal = check([row(1, 10, 0.1, 0.9)], final, final_s=490.0)
    assert goal["final_at_bar"] and not goal["met"]


def test_no_navrl_numbers_no_verdict() -> None:
    assert learning.goal_check([], None, None, targets=None, within_s=1, final_s=1) is None


def test_frames_to_reach_is_the_first_target_eval_with_both_bounds_per_bar() -> None:
    """A bar b needs reach_goal >= b and collision <= 1 - b, at a target stage only."""
    curve = [
        row(0, 0, 0.0, 0.0, 0),
        row(10, 5, 0.95, 0.0, 0),  # an earlier stage: never counts
        row(20, 9, 0.45, 0.2, 1),  # reach below 0.5
        row(25, 10, 0.6, 0.45, 1),  # reach >= 0.5, collision <= 0.5: the 0.5 bar
        row(28, 11, 0.9, 0.15, 1),  # reach >= 0.9 but collision > 0.1
        row(40, 20, 0.9, 0.1, 1),  # both bounds inclusive
    ]
    out = learning.frames_to_reach(curve, [0.5, 0.9, 0.99], targets={1})
    assert out["0.5"]["frames"] == 25 and out["0.9"]["frames"] == 40 and out["0.99"] is None
    assert "held_out" not in out


def test_frames_to_reach_on_held_out_maps_when_the_curve_has_them() -> None:
    curve = [
        {**row(10, 5, 0.95, 0.0), "held_out_reach_goal": 0.4, "held_out_collision": 0.6},
        {**row(20, 9, 0.95, 0.0), "held_out_reach_goal": 0.9, "held_out_collision": 0.1},
    ]
    out = learning.frames_to_reach(curve, [0.9], targets=None)
    assert out["0.9"]["frames"] == 10
    assert out["held_out"]["0.9"] == {
        "frames": 20,
        "seconds": 9,
        "held_out_reach_goal": 0.9,
        "held_out_collision": 0.1,
    }


def held(r: dict, reach: float, collision: float) -> dict:
    return {**r, "held_out_reach_goal": reach, "held_out_collision": collision}


def cpu_goal(curve, final=None, held_final=None, targets=None):
    return learning.frames_goal(
        curve, final, held_final, bar=0.9, within_frames=100, targets=targets
    )


def test_frames_goal_needs_both_map_sets_at_one_evaluation() -> None:
    """Issue #23's CPU goal: 0.9 / 0.1 on the training maps and held out, at the same
    evaluation of the target env, within the frames; seconds play no part."""
    curve = [
        held(row(10, 5, 0.95, 0.05, 1), 0.85, 0.15),  # held out below the bar
        held(row(20, 9000, 0.85, 0.1, 1), 0.95, 0.05),  # own maps below the bar
        held(row(30, 9500, 0.9, 0.1, 0), 0.9, 0.1),  # at the bar, not a target stage
    ]
    assert not cpu_goal(curve, targets={1})["met"]
    assert cpu_goal(curve, targets={1})["first_eval_at_bar"] is None
    curve.append(held(row(40, 10**5, 0.9, 0.1, 1), 0.9, 0.1))  # both bounds inclusive
    goal = cpu_goal(curve, targets={1})
    assert goal["met"] and goal["first_eval_at_bar"]["frames"] == 40
    assert goal["first_eval_at_bar"]["held_out_reach_goal"] == 0.9
    late = [held(row(101, 1, 0.95, 0.0, 1), 0.95, 0.0)]  # past the frames
    assert not cpu_goal(late, targets={1})["met"]


def test_frames_goal_without_held_out_numbers_is_not_met_by_the_curve() -> None:
    goal = cpu_goal([row(10, 5, 1.0, 0.0)])
    assert goal["first_eval_at_bar"] is None and not goal["met"]


def test_frames_goal_by_the_final_export_on_both_map_sets() -> None:
    curve = [row(10, 5, 0.1, 0.9)]
    final = {"frames": 100, "reach_goal": 0.92, "collision": 0.08}
    goal = cpu_goal(curve, final, {"reach_goal": 0.9, "collision": 0.1})
    assert goal["met"] and goal["final"] == {
        "frames": 100,
        "training_maps": True,
        "held_out": True,
    }
    short = cpu_goal(curve, final, {"reach_goal": 0.89, "collision": 0.11})
    assert short["final"]["held_out"] is False and not short["met"]
    assert not cpu_goal(curve, final, None)["met"]  # no held-out evaluation
    late = cpu_goal(curve, {**final, "frames": 101}, {"reach_goal": 0.9, "collision": 0.1})
    assert late["final"]["training_maps"] and not late["met"]
    assert cpu_goal(curve)["final"] is None


def test_a_resumed_run_counts_the_seconds_the_daemon_ran_in_every_sitting() -> None:
    """Two sittings, 100-160 and 1000-1050: the pause between them is not training time."""
    launches = [(100.0, 160.0), (1000.0, 1050.0)]
    assert learning.training_seconds(130.0, launches) == 30.0
    assert learning.training_seconds(500.0, launches) == 60.0  # between sittings
    assert learning.training_seconds(1020.0, launches) == 80.0
    assert learning.training_seconds(2000.0, launches) == 110.0
    assert learning.training_seconds(50.0, launches) == 0.0


# ------------------------------------------------------------ which stages are the target

HOPS = (
    '{name = "hops", spawn = "local", goal_distance = [1.0, 4.0], max_episode_length = 30,'
    " reach_hold = 8, promote = {reach_goal = 0.6, collision = 0.35}}"
)


def stages_config(*overrides: str) -> Config:
    return load_config(
        None,
        [*TINY, "env.num_dynamic_obstacles=0", "eval.num_envs=4", "eval.max_steps=60", *overrides],
        environ={},
    )


def test_a_hops_stage_evaluated_on_the_crossing_is_a_target_stage() -> None:
    """Hops differ from the last stage only in keys NavRL's crossing layout never reads
    (the spawn rule, the hold, a shorter episode than the evaluation's): they count. A
    stage with fewer pillars, or any stage under the training layout, does not."""
    last = '{name = "crossing"}'
    fewer = '{name = "fewer", num_obstacles = 2, promote = {reach_goal = 0.6}}'
    curriculum = f"env.curriculum=[{fewer}, {HOPS}, {last}]"
    assert learning.target_stages(stages_config(curriculum, 'eval.layout="navrl"')) == {1, 2}
    assert learning.target_stages(stages_config(curriculum, 'eval.layout="train"')) == {2}
    assert learning.target_stages(stages_config('eval.layout="navrl"')) is None


def test_target_stages_fly_the_same_evaluation() -> None:
    """The claim behind `target_stages`, on the env itself: the evaluation envs of the
    hops stage and the last stage give the same observations, step for step, and the
    stage with fewer pillars (another key) does not. The drones fly into the field, so
    their LiDAR sees the pillars."""
    fewer = '{name = "fewer", num_obstacles = 2, promote = {reach_goal = 0.6}}'
    curriculum = f'env.curriculum=[{fewer}, {HOPS}, {{name = "crossing"}}]'
    cfg = stages_config(curriculum, 'eval.layout="navrl"', "env.spawn_margin=0.5")
    assert learning.target_stages(cfg) == {1, 2}
    ahead = torch.tensor([0.0, -1.5, 0.0]).expand(4, 1, 3)  # world velocity, to the goals

    def fly(td):
        return td.set(("agents", "action"), ahead.clone())

    flights = []
    for stage in (0, 1, 2):
        env = make_eval_env(cfg.model_copy(update={"env": cfg.env.stage_env(stage)}), "cpu")
        flights.append(env.rollout(120, policy=fly, break_when_any_done=False))
    assert flights[2]["agents", "observation", "lidar"].amax() > 0  # pillars in sight
    assert (flights[1] == flights[2]).all()
    assert not (flights[0] == flights[2]).all()
