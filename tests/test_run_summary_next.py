"""The end-of-run summary's next steps work: every command it prints succeeds on the state
dir as the run left it, and it names only files that exist."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.conftest import TINY, navrl_cli


def summary(stderr: str) -> dict:
    [doc] = [
        d
        for d in (json.loads(x) for x in stderr.splitlines() if x.startswith("{"))
        if d["event"] == "run summary"
    ]
    return doc


def run_each(cwd: Path, commands: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for command in commands:
        proc = subprocess.run(
            command, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, (command, proc.stderr[-2000:])


def test_every_command_the_summary_prints_succeeds(tmp_path: Path) -> None:
    """No evaluation ran: no results file is named, no `export --best` suggested."""
    args = ["run", "--state-dir", "state", *TINY, "eval.interval=0", "run.total_frames=128"]
    proc = navrl_cli(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = summary(proc.stderr)
    run_each(tmp_path, doc["next"])
    assert not [c for c in doc["next"] if "--best" in c]
    assert doc["files"] == ["history.jsonl"]
    assert " report " in doc["next"][0] and "run.total_frames=256" in doc["next"][-1]
    assert (tmp_path / "eval.gif").stat().st_size > 0


def test_the_best_evaluated_checkpoint_is_offered_for_export(tmp_path: Path) -> None:
    args = ["run", "--state-dir", "state", *TINY, "eval.interval=1", "checkpoint.interval=1"]
    proc = navrl_cli(*args, "run.total_frames=128", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = summary(proc.stderr)
    assert doc["files"] == ["history.jsonl", "eval/results.jsonl"]
    [export] = [c for c in doc["next"] if "--best" in c]
    run_each(tmp_path, [export])
