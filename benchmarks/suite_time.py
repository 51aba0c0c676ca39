"""Wall time of the test suite (or part of it), this checkout against a git revision, as JSON.

The revision is extracted into a temp dir and both run in turns, `--repeats` times, each
as its own `make test` runs it (the pytest options of its own Makefile: the revision's
may run serially, this one's with workers), so drift in the machine's load hits both
alike. Prints per side the median and spread of the wall seconds, and the ratio of the
medians; with `--durations`, the slowest tests of each side's last run; and the machine
and its load average before and after.

Run: `.venv/bin/python benchmarks/suite_time.py --ref main [--repeats 3] [-- TESTS...]`
(no TESTS: the whole suite).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def make_test_command(root: Path) -> tuple[dict[str, str], list[str]]:
    """The environment assignments and pytest arguments of `make test`'s pytest line in the
    checkout at `root` (the first pytest line of its Makefile)."""
    for line in (root / "Makefile").read_text().splitlines():
        m = re.match(r"\s*((?:\w+=\S+\s+)*)\$\(BIN\)/python -m pytest(.*)$", line)
        if m:
            assigns = dict(a.split("=", 1) for a in shlex.split(m.group(1)))
            return assigns, shlex.split(m.group(2))
    raise SystemExit(f"{root}/Makefile: no pytest line under `test:`")


def run_suite(root: Path, tests: list[str], durations: int) -> dict[str, Any]:
    """One run of `root`'s `make test` pytest line, with its environment as make sets it
    (nothing added here: a side that does not pin the thread count runs with torch's own)."""
    assigns, make_args = make_test_command(root)
    args = [*make_args, "-p", "no:cacheprovider", f"--durations={durations}", *tests]
    env = {**os.environ, **assigns, "PYTHONPATH": str(root)}
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - t0
    lines = proc.stdout.splitlines()
    summary = next((x for x in reversed(lines) if re.search(r"\d+ (passed|failed).* in ", x)), "")
    slowest = [x.strip() for x in lines if re.match(r"^\d+\.\d+s (call|setup|teardown) ", x)]
    return {
        "seconds": round(seconds, 1),
        "exit_code": proc.returncode,
        "summary": summary.strip("= "),
        "slowest": slowest[:durations],
        # -ra's lines for what failed or errored: a flaky test is named in the JSON
        "failed": [x for x in lines if x.startswith(("FAILED ", "ERROR "))],
    }


def spread(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 1),
        "min": round(min(values), 1),
        "max": round(max(values), 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ref", required=True, help="the git revision to compare against")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--durations", type=int, default=0, help="list the N slowest tests")
    ap.add_argument("tests", nargs="*", help="test paths or ids (default: all)")
    args = ap.parse_args()
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {"this": [], args.ref: []}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "ref"
        base.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", args.ref], capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
        pytest_args = {"this": make_test_command(REPO), args.ref: make_test_command(base)}
        for _ in range(args.repeats):
            runs[args.ref].append(run_suite(base, args.tests, args.durations))
            runs["this"].append(run_suite(REPO, args.tests, args.durations))
    result: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "tests": args.tests or "all",
    }
    for side, side_runs in runs.items():
        result[side] = {
            "make_test_env": pytest_args[side][0],
            "make_test_args": pytest_args[side][1],
            "seconds": spread([r["seconds"] for r in side_runs]),
            "runs": side_runs,
        }
    result["this_over_ref"] = round(
        result["this"]["seconds"]["median"] / result[args.ref]["seconds"]["median"], 3
    )
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
