"""What a person at a terminal sees of a run: log lines that never share a line with the
progress bar, and each progress summary as one compact block (like rsl_rl's iteration
block) instead of a wall of key=value.

Only the console format (a terminal, `log.format = "console"`) renders this way; JSON lines
(journald, pipes, files) keep every field of the summary as it is. On a terminal an info
line is also kept to one screen line (`brief`): a line that wraps breaks the blocks apart.
"""

from __future__ import annotations

import datetime
import errno
import re
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog
from tqdm import tqdm

from navrl_daemon.ops.statistics import grad_norms, loss_terms, other_statistics, update_statistics

# Fewer finished episodes than this in a window: its means are flagged as noisy.
FEW_EPISODES = 10
WIDTH = 92
# The update's statistics per line of a summary block (each cell is 16 wide or more).
CELLS_PER_ROW = 4


class BarAwareStderr:
    """`sys.stderr` as it is when a line is written (a test harness may swap it), with any
    tqdm bar on it cleared before the line and redrawn after it. tqdm's lock (a thread
    lock, set by ops/progress.py) serialises these writes with the bar's own, so a line
    and the bar never interleave, whichever thread logs."""

    def __init__(self) -> None:
        # tqdm's default lock is a multiprocessing RLock, whose first use starts a
        # resource-tracker child process: a daemon should not have one (it outlives a
        # kill -9 of ours). A thread lock does here; ops/progress.py sets the same.
        tqdm.set_lock(threading.RLock())

    def write(self, text: str) -> int:
        if sys.stderr is None:  # descriptor 2 was closed when Python started
            raise OSError(errno.EBADF, "no stderr")
        with tqdm.external_write_mode(file=sys.stderr):
            written = sys.stderr.write(text)
            sys.stderr.flush()
        return written

    def flush(self) -> None:
        if sys.stderr is not None:
            sys.stderr.flush()

    def fileno(self) -> int:
        if sys.stderr is None:
            raise OSError(errno.EBADF, "no stderr")
        return sys.stderr.fileno()

    def isatty(self) -> bool:
        try:
            return bool(sys.stderr.isatty())
        except (AttributeError, ValueError):
            return False


class ProgressTableRenderer:
    """structlog's final processor for the console: "progress" events as a table (see
    `progress_table`), every other event by `fallback` (structlog's ConsoleRenderer); with
    `width` (a terminal's columns), info and debug lines `brief` to fit it."""

    def __init__(
        self, fallback: structlog.typing.Processor, width: Callable[[], int] | None = None
    ) -> None:
        self.fallback = fallback
        self.width = width
        self.outcomes: Outcomes | None = None  # the last window's in which episodes finished

    def __call__(self, logger: Any, name: str, event: dict[str, Any]) -> str:
        if event.get("event") == "progress" and "frames_per_second" in event:
            table = progress_table(event, self.outcomes)
            if event.get("train_episodes"):
                self.outcomes = Outcomes.of(event)
            return table
        if event.get("event") == "evaluation" and "reach_goal" in event:
            return evaluation_line(event)
        if self.width is None or event.get("level") not in ("info", "debug"):
            return str(self.fallback(logger, name, event))
        # ConsoleRenderer takes the fields it renders out of the dict: a copy each time
        return brief(lambda e: str(self.fallback(logger, name, dict(e))), event, self.width())


# Fields an info line on a terminal leaves out: who logged it (the event says what
# happened); JSON lines keep them.
CONTEXT_FIELDS = ("stage",)
# Fields an info line too wide for the terminal loses after its false flags, before the rest.
DETAIL_FIELDS = ("seconds", "frames", "policy_version")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def brief(render: Callable[[dict[str, Any]], str], event: dict[str, Any], width: int) -> str:
    """An info line for a person at a terminal of `width` columns: without the context
    fields, byte counts in kB/MB, paths relative to the working directory, and then, while
    it is wider than the terminal, without its false flags, then its details (byte counts,
    seconds, frames), then other fields: in each, the shortest whose going makes it fit,
    else the longest. How many it left out is said at its end; `iteration` stays."""
    fields = {k: _brief_value(k, v) for k, v in event.items() if k not in CONTEXT_FIELDS}
    if fields.get("policy_version") == fields.get("iteration"):
        fields.pop("policy_version", None)
    fixed = ("event", "level", "timestamp", "logger", "exception", "iteration")
    flags = [k for k in fields if k not in fixed and event[k] is False]
    details = [
        k
        for k in fields
        if k not in fixed and k not in flags and (k.endswith("bytes") or k in DETAIL_FIELDS)
    ]
    others = [k for k in fields if k not in fixed and k not in flags and k not in details]
    line = render(fields)
    left_out = 0
    while (flags or details or others) and _visible_width(line) > width:
        group = flags or details or others
        by_length = sorted(group, key=lambda k: len(str(fields[k])))
        over = _visible_width(line) - width
        fits = [k for k in by_length if len(f" {k}={fields[k]}") >= over]
        gone = fits[0] if fits else by_length[-1]
        group.remove(gone)
        fields.pop(gone)
        left_out += 1
        line = f"{render(fields)} (+{left_out} fields)"
    return line


def _visible_width(text: str) -> int:
    return max(len(ANSI.sub("", line)) for line in text.splitlines() or [""])


def _brief_value(key: str, value: Any) -> Any:
    if key.endswith("bytes") and isinstance(value, int) and not isinstance(value, bool):
        return _size(value)
    if key in ("path", "file", "logdir", "state_dir", "checkpoints") and isinstance(value, str):
        try:
            return str(Path(value).relative_to(Path.cwd()))
        except ValueError:
            return value
    return value


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n}B"


class Outcomes:
    """The outcomes of the last window in which training episodes finished: what a block
    of a window without any shows (with NavRL's long episodes, most windows have none)."""

    def __init__(self, iteration: Any, episodes: int, cells: list[str]) -> None:
        self.iteration, self.episodes, self.cells = iteration, episodes, cells

    @classmethod
    def of(cls, s: dict[str, Any]) -> Outcomes:
        return cls(s.get("iteration"), int(s.get("train_episodes", 0)), _outcome_cells(s))


def progress_table(s: dict[str, Any], earlier: Outcomes | None = None) -> str:
    """One summary (ops/progress.py's fields) as a block of aligned lines; `earlier`:
    the outcomes a window without finished episodes shows instead of its own."""
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
    where = _where_training_is(s)
    if where:
        lines.append(_row("training at", *where))
    episodes = s.get("train_episodes", 0)
    if not episodes and earlier is None:
        lines.append(_row("episodes", "none finished yet"))
    elif not episodes:
        assert earlier is not None
        lines.append(
            _row(
                "episodes",
                f"none since iteration {earlier.iteration}, when {earlier.episodes:,} had:",
            )
        )
        lines.append(_row("outcomes", *earlier.cells))
    else:
        note = " (few: noisy means)" if episodes < FEW_EPISODES else ""
        lines.append(_row("episodes", f"{episodes} finished{note}"))
        lines.append(_row("outcomes", *_outcome_cells(s)))
        lines.append(
            _row(
                "episode",
                f"return {_num(s.get('train_return'))}",
                f"length {_num(s.get('train_episode_len'))} steps",
            )
        )
    # What the update reported, by the names it gave (ops/statistics.py).
    stats = update_statistics(s)
    for label, group in (
        ("losses", loss_terms(stats)),
        ("grad norm", grad_norms(stats)),
        ("update", other_statistics(stats)),
    ):
        cells = [f"{name} {_num(value)}" for name, value in group.items()]
        for start in range(0, len(cells), CELLS_PER_ROW):
            lines.append(_row(label if start == 0 else "", *cells[start : start + CELLS_PER_ROW]))
    if s.get("rolled_back"):
        lines.append(_row("ROLLED BACK", "to the newest valid checkpoint (see the log above)"))
    return "\n".join(lines)


def _where_training_is(s: dict[str, Any]) -> list[str]:
    """The curriculum stage and the share of envs per density level (pillars: share)."""
    cells = []
    if "curriculum_stage" in s:
        name = s.get("curriculum_name")
        cells.append(f"curriculum stage {s['curriculum_stage']}" + (f" ({name})" if name else ""))
    shares = s.get("level_shares")
    if shares:
        pillars = s.get("level_pillars") or list(range(len(shares)))
        levels = " ".join(f"{p}:{share:.0%}" for p, share in zip(pillars, shares, strict=False))
        cells.append(f"envs by pillars {levels}")
    return cells


def _outcome_cells(s: dict[str, Any]) -> list[str]:
    reach, coll = s.get("train_reach_goal", 0.0), s.get("train_collision", 0.0)
    left = s.get("train_out_of_bounds")
    return [
        f"reached {reach:.3f}",
        f"collided {coll:.3f}",
        *([] if left is None else [f"out of bounds {left:.3f}"]),
        f"timed out {timed_out(reach, coll, left):.3f}",
    ]


def timed_out(reach: float, collision: float, out_of_bounds: float | None) -> float:
    """The share of episodes that timed out: neither reached, collided nor left the height
    band. NavRL's `truncated` is not it: a reached episode ends by the time limit too, so
    `truncated` counts it (without `out_of_bounds`, those count as timed out)."""
    return max(0.0, 1.0 - reach - collision - (out_of_bounds or 0.0))


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
