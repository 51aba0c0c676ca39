"""Pictures of a run, drawn with matplotlib's Agg renderer (no display, no GUI toolkit).

- `trajectory_plot`: an evaluation seen from above (`eval --plot`, `report`): pillars shaded
  by height, the dynamic obstacles' paths faint, each drone's path coloured by its outcome,
  start and goal marked; beside it, each drone's altitude along its path.
- `curves_plot`: learning curves for `report` (one PNG per group of panels).
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection, PatchCollection
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from navrl_daemon.rl.evaluate import Trajectories

# Outcome colours (matplotlib's tab10 green, red, orange, blue): saturated, so no shade of
# the grey pillars or the faint obstacle paths can be mistaken for them (tests count these
# pixels).
OUTCOME_COLOURS = {
    "reached": "#2ca02c",
    "collided": "#d62728",
    "out of bounds": "#ff7f0e",
    "timed out": "#1f77b4",
}
DYNAMIC_COLOUR = "#9467bd"
FIGURE_SIZE_IN = (12.0, 7.0)
DPI = 100
# Axes rectangles in figure fractions (left, bottom, width, height): the map is square.
MAP_AXES = (0.065, 0.08, 0.49, 0.84)
COLORBAR_AXES = (0.57, 0.08, 0.012, 0.84)
ALTITUDE_AXES = (0.685, 0.08, 0.3, 0.84)
PILLAR_MAX_HEIGHT_M = 6.0  # the top of NavRL's height bins: the darkest grey


def trajectory_plot(traj: Trajectories, title: str = "") -> bytes:
    """PNG bytes of map 0 and the drones that flew on it (all of them when one map)."""
    outcomes = traj.outcomes()
    shown = [i for i in range(len(outcomes)) if int(traj.map_id[i]) == 0]
    # A bare Figure, not pyplot: no global figure registry, nothing to close.
    fig = Figure(figsize=FIGURE_SIZE_IN, dpi=DPI)
    ax = fig.add_axes(MAP_AXES)
    alt = fig.add_axes(ALTITUDE_AXES)
    _draw_map(ax, traj)
    counts = {k: 0 for k in OUTCOME_COLOURS}
    for i in shown:
        counts[outcomes[i]] += 1
        _draw_drone(ax, alt, traj, i, OUTCOME_COLOURS[outcomes[i]])
    for outcome, n in counts.items():
        if n:  # legend entries only for outcomes that occurred
            ax.plot([], [], color=OUTCOME_COLOURS[outcome], lw=2, label=f"{outcome} ({n})")
    ax.plot([], [], "ko", ms=4, label="start")
    ax.plot([], [], "k*", ms=8, label="goal")
    ax.legend(loc="upper right", fontsize=8, framealpha=0.9)
    where = f"map 0 of {traj.num_maps}: " if traj.num_maps > 1 else ""
    ax.set_title(f"{title}{' — ' if title else ''}{where}{len(shown)} drones", fontsize=10)
    alt.set_title("altitude along the path", fontsize=10)
    alt.set_xlabel("distance flown (m)")
    alt.set_ylabel("z (m)")
    alt.grid(alpha=0.3)
    return _png(fig)


def _draw_map(ax: Axes, traj: Trajectories) -> None:
    half = traj.field_size / 2
    # Square limits that hold the field, every start, path and goal (NavRL's eval layout
    # starts and ends outside the pillar field).
    widest = float(traj.positions[..., :2].abs().max())
    reach = max(half, widest, float(traj.goal[:, :2].abs().max()))
    ax.set_xlim(-reach - 1, reach + 1)
    ax.set_ylim(-reach - 1, reach + 1)
    ax.set_aspect("equal", adjustable="box")
    ax.set_xlabel("x (m)")
    ax.set_ylabel("y (m)")
    ax.add_patch(Rectangle((-half, -half), 2 * half, 2 * half, fill=False, ec="0.6", lw=0.8))
    boxes = traj.pillars.numpy()
    if len(boxes):
        rects = [Rectangle((b[0], b[1]), b[2] - b[0], b[3] - b[1]) for b in boxes]
        pillars = PatchCollection(rects, cmap="Greys", edgecolor="none")
        pillars.set_array(boxes[:, 4])
        pillars.set_clim(0.0, PILLAR_MAX_HEIGHT_M * 1.25)  # the tallest stay short of black
        ax.add_collection(pillars)
        bar = ax.figure.colorbar(pillars, cax=ax.figure.add_axes(COLORBAR_AXES))
        bar.set_label("pillar height (m)", fontsize=8)
    dynamic = traj.dynamic.numpy()  # [T+1,D,3]
    if dynamic.shape[1]:
        paths = [dynamic[:, d, :2] for d in range(dynamic.shape[1])]
        ax.add_collection(LineCollection(paths, colors=DYNAMIC_COLOUR, alpha=0.25, lw=1))
        ax.scatter(dynamic[-1, :, 0], dynamic[-1, :, 1], s=8, c=DYNAMIC_COLOUR, alpha=0.4)


def _draw_drone(ax: Axes, alt: Axes, traj: Trajectories, i: int, colour: str) -> None:
    path = traj.positions[: int(traj.steps[i]) + 1, i].numpy()  # [k+1,3]
    ax.plot(path[:, 0], path[:, 1], color=colour, lw=2, solid_capstyle="round", zorder=3)
    ax.plot(path[0, 0], path[0, 1], "ko", ms=4, zorder=4)
    goal = traj.goal[i].numpy()
    ax.plot(goal[0], goal[1], "k*", ms=8, zorder=4)
    flown = np.concatenate(([0.0], np.cumsum(np.linalg.norm(np.diff(path[:, :2], axis=0), axis=1))))
    alt.plot(flown, path[:, 2], color=colour, lw=1.5)


@dataclass(frozen=True)
class Series:
    """One line of a learning-curve panel: x and y values, a label, markers or a line;
    `band`, per point, the (low, high) of an interval shaded around it (None: no band
    there), e.g. an evaluation's 95 % interval."""

    label: str
    x: Sequence[float]
    y: Sequence[float | None]
    markers: bool = False
    band: Sequence[tuple[float, float] | None] | None = None


@dataclass(frozen=True)
class Panel:
    """One learning-curve plot. `ylim`: fixed y limits (a ratio: 0..1); `from_zero`: the y
    axis starts at 0 (a count, a size, a rate), so that a change of 1 % does not fill the
    panel as if it were a signal. Neither: matplotlib's autoscale (losses)."""

    title: str
    series: Sequence[Series]
    ylim: tuple[float, float] | None = None
    from_zero: bool = False


RATIO_YLIM = (-0.03, 1.03)


def curves_plot(
    panels: Sequence[Panel | tuple[str, Sequence[Series]]],
    *,
    xlabel: str = "frames",
    marks: Sequence[float] = (),
    mark_label: str = "resumed",
) -> bytes:
    """PNG bytes of `curves_figure`."""
    return _png(curves_figure(panels, xlabel=xlabel, marks=marks, mark_label=mark_label))


def curves_figure(
    panels: Sequence[Panel | tuple[str, Sequence[Series]]],
    *,
    xlabel: str = "frames",
    marks: Sequence[float] = (),
    mark_label: str = "resumed",
) -> Figure:
    """Panels side by side, each a `Panel` or (title, series); `marks`: dashed x positions
    (e.g. where the run resumed). A panel with no data says so instead of an empty frame."""
    panels = [p if isinstance(p, Panel) else Panel(*p) for p in panels]
    cols = min(len(panels), 2)
    rows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(6 * cols, 3.4 * rows), dpi=DPI)
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax, panel in zip(axes.flat, panels, strict=False):
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        lowest = math.inf
        for s in panel.series:
            pts = [(x, y) for x, y in zip(s.x, s.y, strict=True) if y is not None]
            if not pts:
                continue
            xs, ys = zip(*pts, strict=True)
            style = {"marker": "o", "ms": 4, "ls": "--"} if s.markers else {"lw": 1.5}
            (line,) = ax.plot(xs, ys, label=s.label, **style)
            if s.band is not None:
                _shade(ax, s, line.get_color())
            lowest = min(lowest, *ys)
        if lowest == math.inf:
            ax.text(0.5, 0.5, "no data yet", ha="center", va="center", transform=ax.transAxes)
            continue
        if panel.ylim is not None:
            ax.set_ylim(*panel.ylim)
        elif panel.from_zero and lowest >= 0:
            ax.set_ylim(0, max(ax.get_ylim()[1], 1e-9))
        for i, x in enumerate(marks):
            ax.axvline(x, color="0.5", ls=":", lw=1, label=mark_label if i == 0 else None)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _shade(ax: Axes, s: Series, colour: str) -> None:
    """`s.band` shaded in the line's colour over the points that have one (a lone point:
    a bar from low to high)."""
    assert s.band is not None
    pts = [(x, b) for x, y, b in zip(s.x, s.y, s.band, strict=True) if y is not None and b]
    xs, lows, highs = [x for x, _ in pts], [b[0] for _, b in pts], [b[1] for _, b in pts]
    if len(pts) == 1:
        ax.vlines(xs, lows, highs, color=colour, alpha=0.4, lw=4)
    elif pts:
        ax.fill_between(xs, lows, highs, color=colour, alpha=0.15, lw=0)


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    FigureCanvasAgg(fig).print_png(buf)
    return buf.getvalue()


def write_png(path: Path, png: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(png)
