"""benchmarks/learning.py's issue-#13 verdict: which evaluations count and when."""

from __future__ import annotations

import importlib.util

from tests.conftest import REPO

_spec = importlib.util.spec_from_file_location("learning_bench", REPO / "benchmarks/learning.py")
assert _spec is not None and _spec.loader is not None
learning = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(learning)

NAVRL = {"reach_goal": 0.5625, "collision": 0.4375}


def row(frames: int, seconds: float, reach: float, collision: float, stage: int | None = None):
    r = {"frames": frames, "seconds": seconds, "reach_goal": reach, "collision": collision}
    return r if stage is None else {**r, "curriculum_stage": stage}


def check(curve, final=None, last_stage=None, final_s=600.0):
    return learning.goal_check(
        curve, final, NAVRL, last_stage=last_stage, within_s=480.0, final_s=final_s
    )


def test_only_evaluations_at_the_last_stage_count() -> None:
    curve = [row(0, 0, 0.0, 0.0, 0), row(10, 60, 0.9, 0.1, 0), row(20, 300, 0.6, 0.4, 2)]
    goal = check(curve, last_stage=2)
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
    assert learning.goal_check([], None, None, last_stage=None, within_s=1, final_s=1) is None
