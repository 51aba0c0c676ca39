"""The report's learning curves read honestly: ratios on 0..1, counts and sizes from 0 (a
1 % wobble does not fill the panel), training outcomes pooled over enough episodes
that a one-episode window cannot draw a spike to 1.0, and evaluations with the 95 %
interval their number of drones allows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from navrl_daemon.analysis.report import RunRecords, pool_episodes, render_html
from navrl_daemon.ops.intervals import share_interval
from navrl_daemon.ops.plots import RATIO_YLIM, Panel, Series, curves_figure


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


def test_a_last_window_of_one_episode_joins_the_point_before_it() -> None:
    """A run stopped just after a window in which one episode failed: the last point is
    the pool of the last full window and that one episode, not a drop to 0."""
    history = rows([(32, 0.5), (32, 0.5), (1, 0.0)])
    points = pool_episodes(history, min_episodes=32)
    assert [f for f, _ in points] == [64, 192]
    assert points[-1][1]["train_reach_goal"] == pytest.approx(16 / 33)


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


def test_a_share_of_episodes_gets_wilsons_interval() -> None:
    """Worked values (64 drones at 0.80: 0.686-0.880), inside 0..1 and not zero wide at 0
    or 1, narrower with more drones; none without episodes."""
    lo, hi = share_interval(0.8, 64)
    assert lo == pytest.approx(0.6863, abs=1e-4) and hi == pytest.approx(0.8797, abs=1e-4)
    wide, narrow = share_interval(0.8, 64), share_interval(0.8, 256)
    assert narrow[1] - narrow[0] < 0.6 * (wide[1] - wide[0])
    zero, one = share_interval(0.0, 64), share_interval(1.0, 64)
    assert zero[0] == 0.0 and 0.03 < zero[1] < 0.1 and one[1] == 1.0 and 0.9 < one[0] < 0.97
    assert share_interval(0.5, 0) is None


def test_the_interval_holds_the_true_share_about_95_times_in_100() -> None:
    """Evaluations of 64 drones of a policy that reaches with p = 0.8: the interval of each
    holds 0.8 in about 95 % of them (4,000 draws: ±~0.01)."""
    generator = torch.Generator().manual_seed(0)
    reached = torch.binomial(
        torch.full((4000,), 64.0), torch.full((4000,), 0.8), generator=generator
    )
    held = [share_interval(float(k) / 64, 64) for k in reached.tolist()]
    coverage = sum(lo <= 0.8 <= hi for lo, hi in held) / len(held)
    assert 0.92 <= coverage <= 0.98, coverage


def test_evaluation_bands_are_shaded_around_their_points() -> None:
    x = [1.0, 2.0, 3.0]
    bands = [share_interval(y, 64) for y in (0.5, 0.6, 0.7)]
    fig = curves_figure(
        [
            Panel("with", [Series("eval", x, [0.5, 0.6, 0.7], markers=True, band=bands)]),
            Panel("one", [Series("final", [3.0], [0.7], markers=True, band=[bands[2]])]),
            Panel("without", [Series("train", x, [0.5, 0.6, 0.7])]),
        ]
    )
    shaded, one, plain = fig.axes[:3]  # two columns: a fourth, hidden
    (area,) = shaded.collections
    ys = area.get_paths()[0].vertices[:, 1]
    assert ys.min() == pytest.approx(bands[0][0]) and ys.max() == pytest.approx(bands[2][1])
    (bar,) = one.collections  # a lone point: a bar from low to high
    assert bar.get_segments()[0][:, 1].tolist() == pytest.approx(list(bands[2]))
    assert not plain.collections


def test_the_reports_best_evaluation_says_how_far_it_may_be_off() -> None:
    evals = [
        {"iteration": 50, "frames": 100, "episodes": 64, "reach_goal": 0.8, "collision": 0.2},
        {"iteration": 100, "frames": 200, "reach_goal": 0.9, "collision": 0.1},  # no count
    ]
    html = render_html(RunRecords(state_dir=Path("state"), evals=evals[:1]), {})
    assert "reach_goal 0.8 (95 %: 0.69–0.88)" in html
    html = render_html(RunRecords(state_dir=Path("state"), evals=evals[1:]), {})
    assert "reach_goal 0.9, collision" in html


@pytest.mark.parametrize("moving", [0, 8])
def test_the_animation_names_moving_obstacles_only_where_there_are_some(moving: int) -> None:
    records = RunRecords(state_dir=Path("state"), video_gif=b"GIF89a", moving_obstacles=moving)
    html = render_html(records, {})
    assert "from above and from the side" in html
    assert ("moving obstacles" in html) == bool(moving)
