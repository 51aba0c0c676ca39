"""Crafted input files through the commands that read them, each a process of its own. JSON out.

The corpus is generated here (navrl_daemon/testing/crafted_files.py writes the files):
policy files (`.pt`), checkpoints (`.nrc`), HDF5 datasets and rollout archives, each with the reason
its refusal must give. Every file goes through the commands that read it, in a state dir
a short run trained (its newest checkpoint: iteration 2):

- policies and checkpoints: `eval --checkpoint`, `checkpoints import` (into that state
  dir, which already holds checkpoints: the file must be refused before anything else),
  `checkpoints export --checkpoint` (`.nrc` only);
- checkpoints again, planted in the state dir under names newer than its own:
  `checkpoints verify` must exit 65, `run` resume past them;
- datasets: `dataset info`, and `run offline.objective=bc` on each (full size only);
- archives: `archive verify`.

Each case passes when its exit code is the one expected (65), stderr holds no traceback
and names the file and the reason. Afterwards: no payload pickle wrote its marker file,
and `run` resumes the state dir from its newest valid checkpoint and trains on (exit 0).

`--small` (the CI size, benchmarks/tests/test_crafted_files.py): one file of each kind of
fault, each through one command; no offline runs, no planted checkpoints. `--fresh`: each
command in a fresh interpreter (`python -m navrl_daemon`) instead of a fork of one that has
imported torch (navrl_daemon/testing/forked.py: the same `cli.main`, without ~5 s of
imports per case).

Run: `.venv/bin/python benchmarks/crafted_files.py [--small] [--fresh]`
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from navrl_daemon.testing import TINY  # noqa: E402
from navrl_daemon.testing import crafted_files as corpus  # noqa: E402

NAVRL_CHECKPOINT = REPO / "tests" / "data" / "navrl_checkpoint.pt"

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
REFUSED = 65
TRAINED = [*TINY, "checkpoint.interval=1", "archive.interval=1", "log.format=json"]
TRAINED_ITERATIONS = 2
FRAMES_PER_ITERATION = 64  # TINY: 8 envs x 8 steps
CASE_TIMEOUT_S = 300
# --small: one file of each kind of fault, each through one command (the CI test).
SMALL = {
    "payload",
    "text",
    "int_keys",
    "complex64",
    "nrc_policy_meta",
    "nrc_learner_list",
    "nrc_payload_state",
    "external_link",
    "virtual_missing_source",
    "huge_rows",
    "soft_link_loop",
    "string_terminals",
    "virtual_dataset",
}

Runner = Callable[[list[str]], subprocess.CompletedProcess[str]]


@dataclass(frozen=True)
class Case:
    family: str
    file: corpus.Crafted
    command: list[str]
    expected: int = REFUSED


@dataclass(frozen=True)
class Setting:
    """Where the cases run: the trained state dir, the corpus, the payload marker."""

    root: Path
    state: Path
    marker: Path
    small: bool


# ---------------------------------------------------------------------------- the corpus


def policy_cases(s: Setting) -> list[Case]:
    """Crafted `.pt` files and `.nrc` checkpoints through `eval`, `import` and `export`."""
    import torch

    valid = torch.load(NAVRL_CHECKPOINT, weights_only=True, map_location="cpu")
    files = {
        **corpus.policy_files(valid, s.root / "policies", s.marker),
        **{
            f"nrc_{k}": v
            for k, v in corpus.checkpoint_files(valid, s.root / "nrc", s.marker).items()
        },
    }
    state = ["--state-dir", str(s.state)]
    cases = []
    for n, case in enumerate(v for k, v in files.items() if not s.small or k in SMALL):
        commands = [
            ["eval", *state, "--checkpoint", str(case.path)],
            ["checkpoints", "import", *state, str(case.path)],
        ]
        if case.path.suffix == ".nrc":
            out = ["--out", str(s.root / "export.pt")]
            commands.append(["checkpoints", "export", *state, *out, "--checkpoint", str(case.path)])
        chosen = [commands[n % len(commands)]] if s.small else commands
        cases += [Case("policies", case, command) for command in chosen]
    return cases


def planted_checkpoint_cases(s: Setting) -> list[Case]:
    """The crafted checkpoints copied into the state dir under newer names than its own:
    `checkpoints verify` names each; the final resume shows `run` skips them."""
    if s.small:
        return []
    checkpoints = s.state / "checkpoints"
    planted = []
    for n, src in enumerate(sorted((s.root / "nrc").glob("*.nrc")), start=10**6):
        path = checkpoints / f"ckpt-{n:09d}.nrc"
        shutil.copyfile(src, path)
        planted.append(corpus.Crafted(path, "invalid checkpoint"))
    verify = ["checkpoints", "verify", "--state-dir", str(s.state)]
    return [Case("planted checkpoints", crafted, verify) for crafted in planted[-1:]]


def dataset_cases(s: Setting) -> list[Case]:
    """Crafted HDF5 datasets through `dataset info`, and (full size) an offline run."""
    cases = []
    for name, case in corpus.dataset_files(s.root / "datasets").items():
        if s.small and name not in SMALL:
            continue
        cases.append(Case("datasets", case, ["dataset", "info", str(case.path)]))
        if not s.small:
            offline = ["offline.objective=bc", f"prefetch.paths=[{json.dumps(str(case.path))}]"]
            run = ["run", "--state-dir", str(s.root / "offline" / name), *TINY, *offline]
            cases.append(Case("datasets", case, run))
    return cases


def archive_cases(s: Setting) -> list[Case]:
    """Crafted copies of the trained run's first archive file through `archive verify`."""
    from navrl_daemon.storage.archive import archive_files

    valid = archive_files(s.state / "archive")[0]
    crafted = corpus.archive_files(valid, s.root / "archives")
    verify = ["archive", "verify"]
    return [
        Case("archives", c, [*verify, str(c.path)])
        for name, c in crafted.items()
        if not s.small or name in SMALL
    ]


FAMILIES: dict[str, Callable[[Setting], list[Case]]] = {
    "policies": policy_cases,
    "planted checkpoints": planted_checkpoint_cases,
    "datasets": dataset_cases,
    "archives": archive_cases,
}


# ---------------------------------------------------------------------------- running


def forked_runner() -> Runner:
    from navrl_daemon.testing import forked

    return lambda args: forked.run(args, timeout=CASE_TIMEOUT_S)


def fresh_runner(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "navrl_daemon", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=ENV,
        timeout=CASE_TIMEOUT_S,
    )


def judge(case: Case, proc: subprocess.CompletedProcess[str], seconds: float) -> dict[str, Any]:
    err = proc.stderr
    result = {
        "family": case.family,
        "file": case.file.path.name,
        "command": " ".join(case.command[:2]),
        "exit_code": proc.returncode,
        "expected": case.expected,
        "traceback": "Traceback" in err,
        "names_file": str(case.file.path) in err,
        "gives_reason": case.file.reason in err,
        "seconds": round(seconds, 2),
    }
    result["ok"] = (
        proc.returncode == case.expected
        and not result["traceback"]
        and result["names_file"]
        and result["gives_reason"]
    )
    if not result["ok"]:
        result["stderr_tail"] = err[-800:]
    return result


def newest_valid(state: Path) -> int | None:
    from navrl_daemon.storage.checkpoint import CheckpointDir, read_header

    found = CheckpointDir(state / "checkpoints").newest_valid()
    return None if found is None else read_header(found[0]).iteration


def resumes(run: Runner, state: Path, newest: int | None) -> dict[str, Any]:
    """`run` on the state dir for two more iterations: where it resumed, its exit."""
    frames = (TRAINED_ITERATIONS + 2) * FRAMES_PER_ITERATION
    proc = run(["run", "--state-dir", str(state), *TRAINED, f"run.total_frames={frames}"])
    events = []
    for line in proc.stderr.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    resumed = [e for e in events if e.get("event") == "resumed from checkpoint"]
    skipped = [e for e in events if e.get("event") == "skipping invalid checkpoint"]
    at = resumed[0].get("iteration") if resumed else None
    return {
        "exit_code": proc.returncode,
        "newest_valid_before": newest,
        "resumed_from": at,
        "skipped_invalid": len(skipped),
        "trained_to": newest_valid(state),
        "traceback": "Traceback" in proc.stderr,
        "ok": proc.returncode == 0 and at == newest and "Traceback" not in proc.stderr,
    }


def run_corpus(root: Path, *, small: bool, run: Runner, runner_name: str) -> dict[str, Any]:
    """Train a state dir, run every family's cases, then the resume; the JSON report."""
    t0 = time.monotonic()
    state = root / "state"
    frames = TRAINED_ITERATIONS * FRAMES_PER_ITERATION
    trained = run(["run", "--state-dir", str(state), *TRAINED, f"run.total_frames={frames}"])
    if trained.returncode != 0:
        raise RuntimeError(f"the training run failed: {trained.stderr[-2000:]}")
    newest = newest_valid(state)
    setting = Setting(root=root / "corpus", state=state, marker=root / "MARKER", small=small)
    results = []
    for family in FAMILIES.values():
        for case in family(setting):
            t = time.monotonic()
            results.append(judge(case, run(case.command), time.monotonic() - t))
    resume = resumes(run, state, newest)
    failures = [r for r in results if not r["ok"]]
    marker = setting.marker.exists()
    written = [str(p.relative_to(root)) for p in (setting.root / "export.pt",) if p.exists()]
    return {
        "benchmark": "crafted_files",
        "size": "small" if small else "full",
        "runner": runner_name,
        "files": len({(r["family"], r["file"]) for r in results}),
        "cases": len(results),
        "by_family": {
            f: sum(r["family"] == f for r in results)
            for f in dict.fromkeys(r["family"] for r in results)
        },
        "failures": failures,
        "marker_written": marker,
        "exports_written": written,
        "resume": resume,
        "ok": not failures and not marker and not written and resume["ok"],
        "seconds": round(time.monotonic() - t0, 1),
        "results": results,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="the CI size: one command per file")
    ap.add_argument("--fresh", action="store_true", help="a fresh interpreter per command")
    args = ap.parse_args()
    run, name = (fresh_runner, "fresh") if args.fresh else (forked_runner(), "fork")
    with tempfile.TemporaryDirectory(prefix="crafted-files-") as tmp:
        report = run_corpus(Path(tmp), small=args.small, run=run, runner_name=name)
    report.update(machine=platform.machine(), cores=os.cpu_count())
    print(json.dumps(report, indent=1))
    sys.exit(0 if report["ok"] else 1)


if __name__ == "__main__":
    main()
