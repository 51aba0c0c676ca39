"""Learning runs' evaluations summed up per span of frames, side by side: how
docs/results.md compares a lever with its control on the same frames.

Each RUN is a state dir that benchmarks/learning.py kept (`--keep-state`: its
`eval/results.jsonl` and `history.jsonl`, readable while the run goes on) or a JSON that
learning.py wrote (its `curve`). For each run it gives:

- `stages`: the frames at which each curriculum stage began (the first progress row at
  that stage in `history.jsonl`; from a JSON, the first evaluation at it), e.g. the end
  of the hops;
- `first_at`: per bar b of `--bars`, the frames of the first evaluation with reach_goal
  >= b and collision <= 1 - b, on the run's own maps and held out (as learning.py's
  `frames_to_reach`, over every evaluation: a run evaluated at one layout throughout);
- `spans`: per span of `--edges` (millions of frames; a span holds the evaluations with
  start < frames <= end, the last edge may be `end`), the evaluations' count and their
  mean reach_goal and collision, own maps and held out (None where the span has none).

`--markdown` prints the spans as a table (one column per run: own (held out), count),
then the stage and bar frames, instead of the JSON. A run that is neither a state dir
with evaluations nor learning.py's JSON exits 65 (bad data) with a message.

Run: `.venv/bin/python benchmarks/curve_spans.py RUN [RUN ...] --edges 3.5 4.6 6.6 9.1
11.8 end [--bars 0.5 0.9] [--markdown] [--out spans.json]`
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path
from typing import Any

from navrl_daemon.analysis.curves import first_at_bar
from navrl_daemon.storage.history import HISTORY_FILE, RESULTS_FILE, read_jsonl

EXIT_DATAERR = 65  # sysexits' EX_DATAERR, the daemon's "bad data"
SHARES = ("reach_goal", "collision", "held_out_reach_goal", "held_out_collision")


class BadInput(Exception):
    """A run this script cannot read: exit 65 with the message."""


def load_run(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(evaluations, progress rows) of one run, each in frame order; the progress rows
    are empty for a JSON (its curve's own stages stand in for them)."""
    if path.is_dir():
        results = read_jsonl(path / RESULTS_FILE, required=("frames", "reach_goal")).rows
        if not results:
            raise BadInput(f"{path}: no evaluations in {RESULTS_FILE} (not a kept run?)")
        history = read_jsonl(path / HISTORY_FILE, required=("frames",)).rows
        return sorted(results, key=lambda r: r["frames"]), history
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise BadInput(f"{path}: neither a state dir nor readable JSON ({err})") from err
    if not isinstance(doc, dict) or doc.get("benchmark") != "learning":
        raise BadInput(f"{path}: not benchmarks/learning.py's output")
    curve = [r for r in doc.get("curve") or [] if r.get("frames", 0) > 0]  # not the untrained
    return curve, []


def stage_starts(evaluations: list[dict[str, Any]], history: list[dict[str, Any]]) -> dict:
    """Curriculum stage -> frames of the first row at it (progress rows where there are)."""
    starts: dict[str, int] = {}
    for row in history or evaluations:
        stage = row.get("curriculum_stage")
        if stage is not None and str(stage) not in starts:
            starts[str(stage)] = row["frames"]
    return starts


def first_at(evaluations: list[dict[str, Any]], bars: list[float]) -> dict[str, Any]:
    """Per map set and bar, the frames of the first evaluation at it (None: never)."""
    out: dict[str, Any] = {}
    for prefix, name in (("", "own"), ("held_out_", "held_out")):
        rows = {str(bar): first_at_bar(evaluations, bar, prefix=prefix) for bar in bars}
        out[name] = {bar: None if row is None else row["frames"] for bar, row in rows.items()}
    return out


def spans(evaluations: list[dict[str, Any]], edges: list[float]) -> list[dict[str, Any]]:
    """Per span (start, end] of `edges` (frames): the evaluations' count and mean shares."""
    out = []
    for start, end in itertools.pairwise(edges):
        inside = [r for r in evaluations if start < r["frames"] <= end]
        row: dict[str, Any] = {
            "from": int(start),
            "to": None if math.isinf(end) else int(end),  # None: to the run's end
            "evaluations": len(inside),
        }
        for key in SHARES:
            values = [float(r[key]) for r in inside if r.get(key) is not None]
            row[key] = round(sum(values) / len(values), 4) if values else None
        out.append(row)
    return out


def summarise(path: Path, edges: list[float], bars: list[float]) -> dict[str, Any]:
    evaluations, history = load_run(path)
    return {
        "run": str(path),
        "evaluations": len(evaluations),
        "last_frames": evaluations[-1]["frames"],
        "stages": stage_starts(evaluations, history),
        "first_at": first_at(evaluations, bars),
        "spans": spans(evaluations, edges),
    }


def parse_edges(words: list[str]) -> list[float]:
    """Millions of frames, rising; `end` (last only) for no upper bound."""
    edges = []
    for i, word in enumerate(words):
        if word == "end" and i == len(words) - 1:
            edges.append(math.inf)
            continue
        try:
            edges.append(float(word) * 1e6)
        except ValueError as err:
            raise BadInput(f"--edges: {word!r} is not a number of millions of frames") from err
    if len(edges) < 2 or any(b <= a for a, b in itertools.pairwise(edges)):
        raise BadInput("--edges: at least two, rising")
    return edges


def millions(frames: float | None, none: str = "never") -> str:
    if frames is None:
        return none
    return "end" if math.isinf(frames) else f"{frames / 1e6:.2f} M"


def share(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def markdown(summaries: list[dict[str, Any]]) -> str:
    names = [Path(s["run"]).name for s in summaries]
    lines = [
        "| span | " + " | ".join(names) + " |",
        "| --- |" + " --- |" * len(names),
    ]
    for i, first in enumerate(summaries[0]["spans"]):
        cells = []
        for s in summaries:
            span = s["spans"][i]
            cells.append(
                f"{share(span['reach_goal'])} ({share(span['held_out_reach_goal'])}), "
                f"{span['evaluations']}"
            )
        label = f"{millions(first['from'])}–{millions(first['to'], 'end')}"
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("")
    for s, name in zip(summaries, names, strict=True):
        stages = ", ".join(f"stage {k} at {millions(v)}" for k, v in s["stages"].items())
        bars = "; ".join(
            f"{where} >= {bar}: {millions(frames)}"
            for where, by_bar in s["first_at"].items()
            for bar, frames in by_bar.items()
        )
        lines.append(f"- {name} (to {millions(s['last_frames'])}): {stages}; first {bars}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", type=Path, nargs="+", help="kept state dirs or learning.py JSONs")
    p.add_argument("--edges", nargs="+", required=True, help="M frames, rising; last may be end")
    p.add_argument("--bars", type=float, nargs="+", default=[0.5, 0.9])
    p.add_argument("--markdown", action="store_true", help="a table instead of the JSON")
    p.add_argument("--out", type=Path, help="also write the JSON here")
    args = p.parse_args()
    try:
        edges = parse_edges(args.edges)
        summaries = [summarise(path, edges, args.bars) for path in args.runs]
    except BadInput as err:
        print(f"curve_spans.py: {err}", file=sys.stderr)
        raise SystemExit(EXIT_DATAERR) from None
    doc = {"benchmark": "curve_spans", "edges": [millions(e) for e in edges], "runs": summaries}
    text = json.dumps(doc, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(markdown(summaries) if args.markdown else text)


if __name__ == "__main__":
    main()
