"""Policies compared drone by drone on the same evaluation drones, from diagnose.py's JSON.

`benchmarks/diagnose.py` keeps every row's per-drone outcomes. Two checkpoints' rows with
the same pillars, layout, maps (seed and count), evaluation (drones, step cap, seed) and
moving obstacles (count, speeds) flew the same drones, so their reach_goal and collision
compare pairwise (navrl_daemon/analysis/paired.py): the difference with its paired 95 %
interval, the drones only one of them reached, McNemar's exact p-value. Every checkpoint
whose path contains `--against` (e.g. `navrl_checkpoint`) is the baseline B; every other
checkpoint is A and is compared with it on each row they share. Files may come from
several diagnose.py runs (each run's evaluation settings and moving obstacles go into the
key: a full-task row never pairs with a static one).

Exit 65 (bad data) with a message when a file is not diagnose.py's JSON with outcomes,
when no checkpoint matches `--against` or none other is there, or when no row is shared.

Run: `.venv/bin/python benchmarks/paired.py A.json [B.json ...] --against
navrl_checkpoint [--out paired.json]`
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from navrl_daemon.analysis.paired import compare_outcomes

EXIT_DATAERR = 65  # sysexits' EX_DATAERR, the daemon's "bad data"
ROW_KEY = ("pillars", "layout", "maps_seed", "maps_count")


class BadInput(Exception):
    """A file or a comparison this script cannot make: exit 65 with the message."""


def rows_of(path: Path) -> dict[str, dict[tuple[Any, ...], dict[str, Any]]]:
    """checkpoint → (row key + evaluation settings) → row, of one diagnose.py JSON."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise BadInput(f"{path}: not readable as JSON ({e})") from e
    if not isinstance(doc, dict) or doc.get("benchmark") != "diagnose":
        raise BadInput(f"{path}: not benchmarks/diagnose.py's output")
    settings = doc.get("eval") or {}
    flown = tuple(settings.get(k) for k in ("episodes", "max_steps", "seed", "dynamic_obstacles"))
    flown += (tuple(settings.get("dynamic_speed_range") or ()),)  # older files: neither
    out: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = {}
    for checkpoint, rows in (doc.get("results") or {}).items():
        keyed = {}
        for row in rows:
            if "pillars" not in row:  # e.g. a --hover-share row: not an evaluation
                continue
            if not isinstance(row.get("outcomes"), str) or "maps_count" not in row:
                raise BadInput(
                    f"{path}: {checkpoint}'s rows have no per-drone outcomes "
                    "(written by a diagnose.py before they were kept): evaluate again"
                )
            keyed[(*(row[k] for k in ROW_KEY), *flown)] = row
        out[checkpoint] = keyed
    return out


def compare_files(paths: list[Path], against: str) -> list[dict[str, Any]]:
    """Every non-baseline checkpoint's shared rows against the baseline's."""
    every: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = {}
    for path in paths:
        for checkpoint, rows in rows_of(path).items():
            every.setdefault(checkpoint, {}).update(rows)
    baselines = [c for c in every if against in c]
    others = [c for c in every if against not in c]
    if not baselines:
        raise BadInput(f"no checkpoint's path contains {against!r}: {sorted(every)}")
    if not others:
        raise BadInput(f"every checkpoint's path contains {against!r}: nothing to compare")
    out = []
    for a in others:
        for b in baselines:
            for key in sorted(set(every[a]) & set(every[b]), key=str):
                row_a, row_b = every[a][key], every[b][key]
                out.append(
                    {
                        "a": a,
                        "b": b,
                        **{k: row_a[k] for k in ("pillars", "layout", "maps", "maps_seed")},
                        "maps_count": row_a["maps_count"],
                        "drones": len(row_a["outcomes"]),
                        **compare_outcomes(row_a["outcomes"], row_b["outcomes"]),
                    }
                )
    if not out:
        raise BadInput(f"no row (pillars, layout, maps, evaluation) is shared with {against!r}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", type=Path, nargs="+", help="diagnose.py JSON outputs")
    parser.add_argument("--against", required=True, help="the baseline checkpoint's path part")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    try:
        rows = compare_files(args.files, args.against)
    except (BadInput, ValueError) as e:
        print(f"paired.py: {e}", file=sys.stderr)
        return EXIT_DATAERR
    doc = {"benchmark": "paired", "against": args.against, "comparisons": rows}
    text = json.dumps(doc, indent=1)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
