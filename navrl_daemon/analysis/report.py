"""`navrl-daemon report`'s page: learning curves, the latest evaluation's paths, the
checkpoints and the config of a run, as one self-contained HTML file.

Everything is embedded (PNG images as data: URIs, inline CSS, no script, no network), so
the file can be mailed or archived. This module only renders what it is given; reading the
state dir is the command's job (commands/report.py).
"""

from __future__ import annotations

import base64
import difflib
import html
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from navrl_daemon.ops.intervals import interval_of, interval_text
from navrl_daemon.ops.plots import RATIO_YLIM, Panel, Series, curves_plot
from navrl_daemon.ops.statistics import GRAD_NORM_SUFFIX, LOSS_SUFFIX, update_statistics
from navrl_daemon.rl.evaluate import eval_rank


@dataclass
class RunRecords:
    """What a state dir holds, already parsed."""

    state_dir: Path
    history: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)  # `checkpoints list` entries
    config_text: str | None = None
    # (file name, text) of the configs earlier runs on the state dir used, oldest first
    earlier_configs: list[tuple[str, str]] = field(default_factory=list)
    trajectory_png: bytes | None = None
    video_gif: bytes | None = None  # the same episodes, animated (ops/video.py)
    trajectory_caption: str = ""
    moving_obstacles: int = 0  # in the replayed evaluation: the captions name them if any
    problems: list[str] = field(default_factory=list)  # shown at the top of the page


# Training episodes pooled per point of the outcome curves: a window in which one episode
# finished would otherwise plot reach_goal 0 or 1, a spike that is only noise.
MIN_EPISODES_PER_POINT = 32
_EPISODE_KEYS = ("train_reach_goal", "train_collision", "train_return", "train_episode_len")


def learning_curves(
    history: Sequence[dict[str, Any]], evals: Sequence[dict[str, Any]]
) -> dict[str, bytes]:
    """PNG per group, by file name: outcomes, losses, the update's other statistics,
    throughput, checkpoints."""
    frames = [r.get("frames") for r in history]
    eval_frames = [r.get("frames") for r in evals]
    marks = _resume_marks(history)
    pooled = pool_episodes(history, MIN_EPISODES_PER_POINT)
    pooled_frames = [frames_at for frames_at, _ in pooled]
    # Every statistic any row holds, in the order the update gave them.
    named = list(dict.fromkeys(k for row in history for k in update_statistics(row)))
    losses = [k for k in named if k.endswith(LOSS_SUFFIX)]
    norms = [k for k in named if k.endswith(GRAD_NORM_SUFFIX)]
    others = [k for k in named if k not in losses and k not in norms]

    def train(key: str, label: str) -> Series:
        return Series(label, frames, [_number(r.get(key)) for r in history])

    def episodes(key: str, label: str) -> Series:
        return Series(label, pooled_frames, [means.get(key) for _, means in pooled])

    def size(key: str, label: str) -> Series:
        return Series(label, frames, [_mb(r.get(key)) for r in history])

    def evaluated(key: str, label: str, *, band: bool = False) -> Series:
        ys = [_number(r.get(key)) for r in evals]
        bands = [interval_of(r.get(key), r.get("episodes")) for r in evals] if band else None
        return Series(label, eval_frames, ys, markers=True, band=bands)

    images = {
        "outcomes.png": curves_plot(
            [
                Panel(
                    "episode outcomes (ratio)",
                    [
                        episodes("train_reach_goal", "train reach_goal"),
                        episodes("train_collision", "train collision"),
                        evaluated("reach_goal", "eval reach_goal (95 % band)", band=True),
                        evaluated("collision", "eval collision (95 % band)", band=True),
                    ],
                    ylim=RATIO_YLIM,
                ),
                Panel(
                    "episode return",
                    [episodes("train_return", "train"), evaluated("return", "eval")],
                ),
                Panel(
                    "episode length (steps)",
                    [episodes("train_episode_len", "train"), evaluated("episode_len", "eval")],
                    from_zero=True,
                ),
            ],
            marks=marks,
        ),
        # What the update reported, by the names it gave (ops/statistics.py).
        "losses.png": curves_plot(
            [
                *(
                    Panel(f"{key.removesuffix(LOSS_SUFFIX)} loss", [train(key, key)])
                    for key in losses
                ),
                Panel(
                    "gradient norm (before clipping)",
                    [train(key, key.removesuffix(GRAD_NORM_SUFFIX)) for key in norms],
                    from_zero=True,
                ),
            ],
            marks=marks,
        ),
        **(
            {"update.png": curves_plot([Panel(k, [train(k, k)]) for k in others], marks=marks)}
            if others
            else {}
        ),
        "throughput.png": curves_plot(
            [
                Panel(
                    "frames per second",
                    [train("frames_per_second", "frames/s")],
                    from_zero=True,
                ),
                Panel("policy lag (versions)", [train("policy_lag", "mean lag")], from_zero=True),
            ],
            marks=marks,
        ),
        "checkpoints.png": curves_plot(
            [
                Panel(
                    "checkpoint stall per summary window (s)",
                    [train("checkpoint_stall_s", "training held up")],
                    from_zero=True,
                ),
                Panel(
                    "last checkpoint size (MB)",
                    [
                        size("checkpoint_stored_bytes", "stored"),
                        size("checkpoint_raw_bytes", "raw"),
                    ],
                    from_zero=True,
                ),
            ],
            marks=marks,
        ),
    }
    return images


def pool_episodes(
    history: Sequence[dict[str, Any]], min_episodes: int
) -> list[tuple[float, dict[str, float]]]:
    """(frames, episode-weighted means of the train_* episode stats) over consecutive rows
    holding at least `min_episodes` finished episodes together; the last point may hold
    fewer only if it is the only one: a shorter tail joins the point before it, whose
    frames it takes (a last window of one episode would plot reach_goal 0 or 1). Rows
    without `train_episodes` (histories written before it) count as one each."""
    points: list[tuple[float, dict[str, float]]] = []
    sums: dict[str, float] = {}
    count = 0.0
    last_sums: dict[str, float] = {}
    last_count = 0.0
    last_frames: float | None = None
    for row in history:
        n = _number(row.get("train_episodes"))
        n = 1.0 if n is None and _number(row.get("train_reach_goal")) is not None else n or 0.0
        last_frames = _number(row.get("frames"))
        if n <= 0:
            continue
        for key in _EPISODE_KEYS:
            value = _number(row.get(key))
            if value is not None:
                sums[key] = sums.get(key, 0.0) + n * value
        count += n
        if count >= min_episodes and last_frames is not None:
            points.append((last_frames, {k: v / count for k, v in sums.items()}))
            last_sums, last_count = sums, count
            sums, count = {}, 0.0
    if count and last_frames is not None:
        if points:  # the tail joins the last full point
            points.pop()
            for key, value in last_sums.items():
                sums[key] = sums.get(key, 0.0) + value
            count += last_count
        points.append((last_frames, {k: v / count for k, v in sums.items()}))
    return points


def best_eval(evals: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The best evaluation by `eval_rank`; None without a scored one."""
    scored = [r for r in evals if _number(r.get("reach_goal")) is not None]
    return max(scored, key=eval_rank) if scored else None


def render_html(records: RunRecords, images: dict[str, bytes]) -> str:
    """The page: summary, problems, curves, trajectories, checkpoints, config."""
    title = f"navrl-daemon report: {records.state_dir}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        # An empty icon, so the browser asks for no favicon file.
        '<link rel="icon" href="data:,">',
        f"<title>{_e(title)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        f"<p class=note>generated {_e(time.strftime('%Y-%m-%d %H:%M:%S %Z'))}</p>",
    ]
    if records.problems:
        items = "".join(f"<li>{_e(p)}</li>" for p in records.problems)
        parts.append(f'<section id="problems"><h2>Problems</h2><ul>{items}</ul></section>')
    parts.append(_summary(records))
    parts.append('<section id="curves"><h2>Learning curves</h2>')
    captions = {
        "outcomes.png": "Training episodes (lines: each point pools consecutive summary "
        f"windows until at least {MIN_EPISODES_PER_POINT} episodes finished, weighted by "
        "episodes) and evaluations (dots) against frames trained; dotted lines mark resumes.",
        "losses.png": "The update's loss terms and gradient norms, mean over each summary window.",
        "update.png": "The update's other statistics (KL, the policy's entropy, the critic's "
        "fit, learning rate, steps), mean over each summary window.",
        "throughput.png": "Training throughput and the policy lag of the rollouts.",
        "checkpoints.png": "Time training was held up taking checkpoint snapshots, and the "
        "size of the last checkpoint written.",
    }
    for name, png in images.items():
        parts.append(_figure(png, name, captions.get(name, name)))
    parts.append("</section>")
    parts.append('<section id="trajectories"><h2>Latest evaluation, seen from above</h2>')
    if records.trajectory_png is not None:
        parts.append(_figure(records.trajectory_png, "trajectories", records.trajectory_caption))
    else:
        parts.append(f"<p class=note>{_e(records.trajectory_caption)}</p>")
    if records.video_gif is not None:
        parts.append(
            _figure(
                records.video_gif,
                "episodes",
                "The same episodes as they flew: from above and from the side"
                + (", the moving obstacles in purple" if records.moving_obstacles else "")
                + " (also written as episodes.gif).",
                mime="image/gif",
            )
        )
    parts.append("</section>")
    parts.append(_checkpoint_table(records.checkpoints))
    parts.append('<section id="config"><h2>Config (STATE_DIR/config.toml)</h2>')
    if records.config_text is None:
        parts.append("<p class=note>no config.toml in the state dir</p>")
    else:
        parts.append(f"<pre>{_e(records.config_text)}</pre>")
    parts.append(_config_changes(records))
    parts.append("</section></body></html>")
    return "\n".join(parts) + "\n"


def _summary(records: RunRecords) -> str:
    rows: list[tuple[str, Any]] = []
    if records.history:
        last = records.history[-1]
        rows += [
            ("iteration", last.get("iteration")),
            ("frames", last.get("frames")),
            ("frames/s (last window)", last.get("frames_per_second")),
            ("last history row", _when(last.get("time"))),
            ("history rows", len(records.history)),
        ]
    else:
        rows.append(("history", "no rows in history.jsonl"))
    rows.append(("evaluations", len(records.evals)))
    best = best_eval(records.evals)
    if best is not None:
        rows.append(
            (
                "best evaluation",
                f"iteration {best.get('iteration')}: reach_goal {_fmt(best.get('reach_goal'))}"
                f"{interval_text(best.get('reach_goal'), best.get('episodes'))}, "
                f"collision {_fmt(best.get('collision'))}, return {_fmt(best.get('return'))}",
            )
        )
    valid = [c for c in records.checkpoints if c.get("valid")]
    rows.append(("checkpoints", f"{len(valid)} valid of {len(records.checkpoints)}"))
    body = "".join(f"<tr><th>{_e(k)}</th><td>{_e(_fmt(v))}</td></tr>" for k, v in rows)
    return f'<section id="summary"><h2>Summary</h2><table>{body}</table></section>'


def _checkpoint_table(entries: Sequence[dict[str, Any]]) -> str:
    head = "<tr><th>file</th><th>iteration</th><th>frames</th><th>stored bytes</th>"
    head += "<th>created</th><th>status</th></tr>"
    rows = []
    for c in entries:
        status = "valid" if c.get("valid") else f"INVALID: {c.get('reason')}"
        cells = (
            Path(str(c.get("path"))).name,
            c.get("iteration"),
            c.get("frames"),
            c.get("stored_bytes"),
            _when(c.get("created")),
            status,
        )
        rows.append("<tr>" + "".join(f"<td>{_e(_fmt(v))}</td>" for v in cells) + "</tr>")
    if not rows:
        return '<section id="checkpoints"><h2>Checkpoints</h2><p class=note>none</p></section>'
    table = f"<table>{head}{''.join(rows)}</table>"
    return f'<section id="checkpoints"><h2>Checkpoints</h2>{table}</section>'


def _figure(image: bytes, alt: str, caption: str, mime: str = "image/png") -> str:
    data = base64.b64encode(image).decode("ascii")
    return (
        f'<figure><img src="data:{mime};base64,{data}" alt="{_e(alt)}">'
        f"<figcaption>{_e(caption)}</figcaption></figure>"
    )


def _config_changes(records: RunRecords) -> str:
    """Each earlier run's config and what the next one changed (a unified diff), so a
    resume with changed settings is visible next to the curves it bent."""
    if not records.earlier_configs:
        return "<p class=note>Every run on this state dir used this config.</p>"
    versions = [*records.earlier_configs, ("config.toml (current)", records.config_text or "")]
    parts = [f"<h3>Changed between runs ({len(versions) - 1} change(s))</h3>"]
    for (old_name, old), (new_name, new) in itertools.pairwise(versions):
        diff = difflib.unified_diff(
            old.splitlines(), new.splitlines(), old_name, new_name, lineterm="", n=0
        )
        parts.append(f"<pre class=diff>{_e(chr(10).join(diff))}</pre>")
    return "".join(parts)


def _resume_marks(history: Sequence[dict[str, Any]]) -> list[float]:
    """Frames at each resume: those of the row before the first row after it."""
    marks = []
    for prev, row in itertools.pairwise(history):
        if row.get("resumed_from") is not None and _number(prev.get("frames")) is not None:
            marks.append(float(prev["frames"]))
    return marks


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _mb(v: Any) -> float | None:
    n = _number(v)
    return None if n is None else n / 1e6


def _when(t: Any) -> str | None:
    n = _number(t)
    return None if n is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(n))


def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _e(v: Any) -> str:
    return html.escape(str(v), quote=True)


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1250px; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { text-align: left; padding: 0.2em 0.8em; border-bottom: 1px solid #eee; }
figure { margin: 1em 0; } img { max-width: 100%; height: auto; }
figcaption, .note { color: #555; font-size: 0.9em; }
pre { background: #f6f6f6; padding: 1em; overflow-x: auto; font-size: 0.85em; }
#problems { background: #fff3f3; border: 1px solid #d62728; padding: 0 1em; }
"""
