"""JSON-lines files of a state dir: `history.jsonl` (one row per progress summary) and the
readers `report` and `status` share with `eval/results.jsonl`.

A row is one JSON object per line. The daemon appends each row as it is made, all or
nothing (storage/atomic.py `append_line`: a torn tail is cut before the next row goes on);
a row whose write fails (disk full, I/O error) waits in memory and goes out with the next
one (`JsonLinesFile`). A reader treats a last line without its newline as still being
written (or torn by a crash), and any other line that is not a JSON object as corrupt
(named by file and line, the other rows still used).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from navrl_daemon.storage.atomic import append_line, write_atomic

HISTORY_FILE = "history.jsonl"
# One line per evaluation (stages/evaluator.py), relative to the state dir.
RESULTS_FILE = "eval/results.jsonl"
# Rows kept in memory while their file cannot be written (a few hours of evaluations).
MAX_WAITING_ROWS = 10_000
# Written by a running daemon: its pid and health endpoint URL (what `status` asks).
DAEMON_FILE = "daemon.json"


@dataclass(frozen=True)
class BadLine:
    path: Path
    line: int  # 1-based
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}"


@dataclass
class JsonLines:
    rows: list[dict[str, Any]] = field(default_factory=list)
    bad: list[BadLine] = field(default_factory=list)


def read_jsonl(path: Path, *, required: tuple[str, ...] = ()) -> JsonLines:
    """Every row of `path` (none if the file does not exist); rows that lack one of
    `required` or hold a non-integer "iteration" count as bad lines."""
    out = JsonLines()
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return out
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    elif lines:
        lines.pop()  # no newline yet: a row being written right now
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as err:
            out.bad.append(BadLine(path, number, f"not JSON ({err.msg})"))
            continue
        if not isinstance(row, dict):
            out.bad.append(BadLine(path, number, "not a JSON object"))
            continue
        missing = [k for k in required if k not in row]
        if missing:
            out.bad.append(BadLine(path, number, f"missing {', '.join(missing)}"))
            continue
        if "iteration" in row and (
            not isinstance(row["iteration"], int) or isinstance(row["iteration"], bool)
        ):
            out.bad.append(BadLine(path, number, "iteration is not an integer"))
            continue
        out.rows.append(row)
    return out


class JsonLinesFile:
    """A JSON-lines file the daemon appends to, whose failed writes are retried: a row that
    cannot be written waits, in order, and goes out before the next row (or at `flush`).
    At most `MAX_WAITING_ROWS` wait; beyond that the oldest are dropped (`dropped`)."""

    def __init__(self, path: Path, *, fsync: bool = True) -> None:
        self.path = path
        self.fsync = fsync
        self.waiting: deque[str] = deque()
        self.dropped = 0

    def append(self, row: dict[str, Any]) -> OSError | None:
        """Queue `row` and write every waiting row; the error that stopped them, if any."""
        self.waiting.append(json.dumps(row))
        if len(self.waiting) > MAX_WAITING_ROWS:
            self.waiting.popleft()
            self.dropped += 1
        return self.flush()

    def flush(self) -> OSError | None:
        while self.waiting:
            try:
                append_line(self.path, self.waiting[0], fsync=self.fsync)
            except OSError as err:
                return err
            self.waiting.popleft()
        return None


class HistoryFile(JsonLinesFile):
    """`STATE_DIR/history.jsonl`, written by the daemon only (it holds the state-dir lock).
    Rows are flushed, not fsynced: a crash loses at most what the next resume would cut
    anyway, and the event loop is not held up by the disk."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, fsync=False)


def cut_rows(path: Path, iteration: int) -> int:
    """Keep the rows of the JSON-lines file `path` up to `iteration` (the checkpoint a run
    starts from: later rows are about to be redone) and drop unreadable lines; returns how
    many lines went. The file is replaced atomically, and only when
    something goes."""
    if not path.exists():
        return 0
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    kept = []
    for line in lines:
        try:
            row = json.loads(line)
            keep = isinstance(row, dict) and int(row["iteration"]) <= iteration
        except (ValueError, KeyError, TypeError):
            keep = False  # a torn last line after kill -9, or a corrupt one
        if keep:
            kept.append(line)
    if len(kept) < len(lines) or (lines and not path.read_bytes().endswith(b"\n")):
        write_atomic(path, "".join(line + "\n" for line in kept).encode())
    return len(lines) - len(kept)


def read_results(path: Path) -> Iterator[dict[str, Any]]:
    """The rows of `eval/results.jsonl` in order, skipping a torn last line (kill -9)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and "iteration" in row:
            yield row


def eval_scores(path: Path) -> dict[int, float]:
    """reach_goal by iteration from the earlier evaluations in `path` (keep_best)."""
    scores: dict[int, float] = {}
    for row in read_results(path):
        try:
            scores[int(row["iteration"])] = float(row["reach_goal"])
        except (KeyError, TypeError, ValueError):
            continue
    return scores
