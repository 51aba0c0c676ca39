"""What a person at a terminal sees of a run: log lines that never share a line with the
progress bar, and each progress summary as one compact block (like rsl_rl's iteration
block) instead of a wall of key=value.

Only the console format (a terminal, `log.format = "console"`) renders this way; JSON lines
(journald, pipes, files) keep every field of the summary as it is.
"""

from __future__ import annotations

import datetime
import sys
import threading
from typing import Any

import structlog
from tqdm import tqdm

# Fewer finished episodes than this in a window: its means are flagged as noisy.
FEW_EPISODES = 10
WIDTH = 92


class BarAwareStderr:
    """`sys.stderr` as it is when a line is written (a test harness may swap it), with any
    tqdm bar on it cleared before the line and redrawn after it. tqdm's lock (a thread
    lock, set by stages/progress.py) serialises these writes with the bar's own, so a line
    and the bar never interleave, whichever thread logs."""

    def __init__(self) -> None:
        # tqdm's default lock is a multiprocessing RLock, whose first use starts a
        # resource-tracker child process: a daemon should not have one (it outlives a
        # kill -9 of ours). A thread lock does here; stages/progress.py sets the same.
        tqdm.set_lock(threading.RLock())

    def write(self, text: str) -> int:
        with tqdm.external_write_mode(file=sys.stderr):
            written = sys.stderr.write(text)
            sys.stderr.flush()
        return written

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        try:
            return bool(sys.stderr.isatty())
        except (AttributeError, ValueError):
            return False


class ProgressTableRenderer:
    """structlog's final processor for the console: "progress" events as a table (see
    `progress_table`), every other event by `fallback` (structlog's ConsoleRenderer)."""

    def __init__(self, fallback: structlog.typing.Processor) -> None:
        self.fallback = fallback

    def __call__(self, logger: Any, name: str, event: dict[str, Any]) -> str:
        if event.get("event") == "progress" and "frames_per_second" in event:
            return progress_table(event)
        if event.get("event") == "evaluation" and "reach_goal" in event:
            return evaluation_line(event)
        return str(self.fallback(logger, name, event))


def progress_table(s: dict[str, Any]) -> str:
    """One summary (stages/progress.py's fields) as a block of aligned lines."""
    when = _clock(s.get("timestamp"))
    frames = s.get("frames", 0)
    total = s.get("total_frames")
    done = f"{frames:,} / {total:,} frames ({100 * frames / total:.1f} %)" if total else ""
    title = f" iteration {s.get('iteration')} · {done} · {when} "
    lines = [f"{'─' * 3}{title}".ljust(WIDTH, "─")]

    busy = s.get("busy") or {}
    rate = f"{s['frames_per_second']:,.0f} frames/s"
    eta = _duration(s.get("eta_s"))
    lag = s.get("policy_lag")
    lines.append(
        _row(
            "throughput",
            rate,
            f"ETA {eta}",
            f"policy lag {lag:.1f}" if isinstance(lag, int | float) else "",
            "busy " + ", ".join(f"{k} {v:.0%}" for k, v in busy.items()),
        )
    )
    episodes = s.get("train_episodes", 0)
    note = " (few: noisy means)" if 0 < episodes < FEW_EPISODES else ""
    if not episodes:
        note = " in this window: no outcomes to show"
    lines.append(_row("episodes", f"{episodes} finished{note}"))
    if episodes:
        reach, coll = s.get("train_reach_goal", 0.0), s.get("train_collision", 0.0)
        # A reached episode ends by the time limit too (`truncated` counts it), so "timed
        # out" is the rest: neither reached, collided nor out of bounds (left the height
        # band; a summary without `train_out_of_bounds` counts those as timed out).
        left = s.get("train_out_of_bounds")
        timed_out = max(0.0, 1.0 - reach - coll - (left or 0.0))
        lines.append(
            _row(
                "outcomes",
                f"reached {reach:.3f}",
                f"collided {coll:.3f}",
                *([] if left is None else [f"out of bounds {left:.3f}"]),
                f"timed out {timed_out:.3f}",
            )
        )
        lines.append(
            _row(
                "episode",
                f"return {_num(s.get('train_return'))}",
                f"length {_num(s.get('train_episode_len'))} steps",
            )
        )
    losses = [
        f"{label} {_num(s[key])}"
        for key, label in (
            ("actor_loss", "actor"),
            ("critic_loss", "critic"),
            ("entropy", "entropy"),
            ("bc_loss", "bc"),
        )
        if key in s
    ]
    if losses:
        lines.append(_row("losses", *losses))
    grads = [
        f"{label} {_num(s[key])}"
        for key, label in (
            ("actor_grad_norm", "actor"),
            ("critic_grad_norm", "critic"),
            ("explained_var", "explained var"),
        )
        if key in s
    ]
    if grads:
        lines.append(_row("grad norm", *grads))
    if s.get("rolled_back"):
        lines.append(_row("ROLLED BACK", "to the newest valid checkpoint (see the log above)"))
    return "\n".join(lines)


def evaluation_line(e: dict[str, Any]) -> str:
    """One evaluation (stages/evaluator.py's record) on one line."""
    stage = f", curriculum stage {e['curriculum_stage']}" if "curriculum_stage" in e else ""
    return (
        f"─── evaluation of iteration {e.get('iteration')} · {_clock(e.get('timestamp'))}: "
        f"reach_goal {_num(e.get('reach_goal'))}, collision {_num(e.get('collision'))}, "
        f"return {_num(e.get('return'))}, length {_num(e.get('episode_len'))} steps "
        f"({e.get('episodes')} drones, {_num(e.get('seconds'))} s{stage})"
    )


def _row(label: str, *cells: str) -> str:
    return f"  {label:<11} " + "  ".join(f"{c:<16}" for c in cells if c).rstrip()


def _num(v: Any) -> str:
    if not isinstance(v, int | float):
        return "—"
    return f"{v:.4g}" if abs(v) < 1000 else f"{v:,.0f}"


def _duration(seconds: Any) -> str:
    if not isinstance(seconds, int | float) or seconds != seconds or seconds < 0:
        return "—"
    return str(datetime.timedelta(seconds=round(seconds)))


def _clock(timestamp: Any) -> str:
    """HH:MM:SS local time of structlog's ISO UTC timestamp (now if absent)."""
    try:
        when = datetime.datetime.fromisoformat(str(timestamp).replace("Z", "+00:00"))
    except ValueError:
        when = datetime.datetime.now(datetime.UTC)
    return when.astimezone().strftime("%H:%M:%S")
