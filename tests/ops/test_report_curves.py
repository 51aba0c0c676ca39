"""The report's learning curves read honestly: ratios on 0..1, counts and sizes from 0 (a
1 % wobble does not fill the panel), and training outcomes pooled over enough episodes
that a one-episode window cannot draw a spike to 1.0."""

from __future__ import annotations

import pytest

from navrl_daemon.ops.plots import RATIO_YLIM, Panel, Series, curves_figure
from navrl_daemon.ops.report import pool_episodes


def rows(values: list[tuple[int, float]]) -> list[dict]:
    """History rows: (episodes finished in the window, train_reach_goal)."""
    return [
        {"iteration": i, "frames": 64 * i, "train_episodes": n, "train_reach_goal": v}
        for i, (n, v) in enumerate(values, start=1)
        if n
    ]


def test_pooling_weights_by_episodes_and_needs_enough_of_them() -> None:
    # 30 episodes at 0.0, a window with one lucky episode, 40 at 0.5, then 32 at 0.25.
    history = rows([(30, 0.0), (1, 1.0), (40, 0.5), (32, 0.25)])
    points = pool_episodes(history, min_episodes=32)
    assert [f for f, _ in points] == [192, 256]
    assert points[0][1]["train_reach_goal"] == pytest.approx(21 / 71)  # no spike to 1.0
    assert points[1][1]["train_reach_goal"] == pytest.approx(0.25)


def test_windows_without_episodes_add_nothing_and_old_rows_count_one() -> None:
    history = [
        {"iteration": 1, "frames": 64, "train_episodes": 0},
        {"iteration": 2, "frames": 128, "train_reach_goal": 1.0},  # before train_episodes
        {"iteration": 3, "frames": 192, "train_reach_goal": 0.0},
    ]
    points = pool_episodes(history, min_episodes=2)
    assert points == [(192, {"train_reach_goal": 0.5})]


def test_ratio_panels_span_0_to_1_and_counts_start_at_0() -> None:
    x = [1.0, 2.0, 3.0]
    fig = curves_figure(
        [
            Panel("ratio", [Series("r", x, [0.50, 0.51, 0.52])], ylim=RATIO_YLIM),
            Panel("length", [Series("len", x, [198.4, 199.0, 200.0])], from_zero=True),
            Panel("size", [Series("MB", x, [2.0, 2.01, 2.02])], from_zero=True),
            ("loss", [Series("loss", x, [-0.5, -0.4, -0.45])]),  # autoscaled as before
        ]
    )
    ratio, length, size, loss = fig.axes
    assert ratio.get_ylim() == RATIO_YLIM
    assert length.get_ylim()[0] == 0 and length.get_ylim()[1] >= 200
    assert size.get_ylim()[0] == 0
    assert loss.get_ylim()[0] < -0.5 < -0.4 < loss.get_ylim()[1] < 0
