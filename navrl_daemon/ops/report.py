"""`navrl-daemon report`'s page: learning curves, the latest evaluation's paths, the
checkpoints and the config of a run, as one self-contained HTML file.

Everything is embedded (PNG images as data: URIs, inline CSS, no script, no network), so
the file can be mailed or archived. This module only renders what it is given; reading the
state dir is the command's job (commands/report.py).
"""

from __future__ import annotations

import base64
import html
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from navrl_daemon.ops.plots import Series, curves_plot
from navrl_daemon.rl.evaluate import eval_rank


@dataclass
class RunRecords:
    """What a state dir holds, already parsed."""

    state_dir: Path
    history: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)  # `checkpoints list` entries
    config_text: str | None = None
    trajectory_png: bytes | None = None
    trajectory_caption: str = ""
    problems: list[str] = field(default_factory=list)  # shown at the top of the page


def learning_curves(
    history: Sequence[dict[str, Any]], evals: Sequence[dict[str, Any]]
) -> dict[str, bytes]:
    """PNG per group, by file name: outcomes, losses, throughput, checkpoints."""
    frames = [r.get("frames") for r in history]
    eval_frames = [r.get("frames") for r in evals]
    marks = _resume_marks(history)

    def train(key: str, label: str) -> Series:
        return Series(label, frames, [_number(r.get(key)) for r in history])

    def size(key: str, label: str) -> Series:
        return Series(label, frames, [_mb(r.get(key)) for r in history])

    def evaluated(key: str, label: str) -> Series:
        return Series(label, eval_frames, [_number(r.get(key)) for r in evals], markers=True)

    images = {
        "outcomes.png": curves_plot(
            [
                (
                    "episode outcomes (ratio)",
                    [
                        train("train_reach_goal", "train reach_goal"),
                        train("train_collision", "train collision"),
                        evaluated("reach_goal", "eval reach_goal"),
                        evaluated("collision", "eval collision"),
                    ],
                ),
                (
                    "episode return",
                    [train("train_return", "train"), evaluated("return", "eval")],
                ),
                (
                    "episode length (steps)",
                    [train("train_episode_len", "train"), evaluated("episode_len", "eval")],
                ),
            ],
            marks=marks,
        ),
        "losses.png": curves_plot(
            [
                ("actor loss", [train("actor_loss", "actor")]),
                ("critic loss", [train("critic_loss", "critic")]),
                ("entropy", [train("entropy", "entropy")]),
                (
                    "gradient norm (before clipping)",
                    [train("actor_grad_norm", "actor"), train("critic_grad_norm", "critic")],
                ),
            ],
            marks=marks,
        ),
        "throughput.png": curves_plot(
            [
                ("frames per second", [train("frames_per_second", "frames/s")]),
                ("policy lag (versions)", [train("policy_lag", "mean lag")]),
            ],
            marks=marks,
        ),
        "checkpoints.png": curves_plot(
            [
                (
                    "checkpoint stall per summary window (s)",
                    [train("checkpoint_stall_s", "training held up")],
                ),
                (
                    "last checkpoint size (MB)",
                    [
                        size("checkpoint_stored_bytes", "stored"),
                        size("checkpoint_raw_bytes", "raw"),
                    ],
                ),
            ],
            marks=marks,
        ),
    }
    return images


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
        "outcomes.png": "Training episodes (lines, mean over each summary window) and "
        "evaluations (dots) against frames trained; dotted lines mark resumes.",
        "losses.png": "PPO losses and gradient norms, mean over each summary window.",
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
    parts.append("</section>")
    parts.append(_checkpoint_table(records.checkpoints))
    parts.append('<section id="config"><h2>Config (STATE_DIR/config.toml)</h2>')
    if records.config_text is None:
        parts.append("<p class=note>no config.toml in the state dir</p>")
    else:
        parts.append(f"<pre>{_e(records.config_text)}</pre>")
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
                f"iteration {best.get('iteration')}: reach_goal {_fmt(best.get('reach_goal'))}, "
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


def _figure(png: bytes, alt: str, caption: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return (
        f'<figure><img src="data:image/png;base64,{data}" alt="{_e(alt)}">'
        f"<figcaption>{_e(caption)}</figcaption></figure>"
    )


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
