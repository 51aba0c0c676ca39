"""Feedback on long iterations: a summary at least every log.summary_seconds whatever
log.summary_interval says, the curriculum stage and the envs' density levels in it, an
evaluation of the first iteration (a number within minutes on a CPU), and the bar saying
what runs inside an iteration."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from navrl_daemon.ops.console import progress_table
from navrl_daemon.ops.progress import ProgressLog
from tests.conftest import TINY, navrl_cli

STAGES = (
    "env.curriculum=[{name = 'near', max_episode_length = 20,"
    " promote = {reach_goal = 1.0, evals = 99}}, {name = 'far'}]"
)


def events(stderr: str) -> list[dict]:
    return [json.loads(x) for x in stderr.splitlines() if x.startswith("{")]


def test_summaries_come_by_the_clock_and_say_where_training_is(tmp_path: Path) -> None:
    """summary_interval 1000 and eval.interval 1000 over 24 iterations: by the old rules
    one summary (the last, partial window) and no evaluation."""
    proc = navrl_cli(
        "run",
        "--state-dir",
        str(tmp_path / "s"),
        *TINY,
        "log.summary_interval=1000",
        "log.summary_seconds=0.5",
        "eval.interval=1000",
        "env.navigation.map_levels=[0,2,4]",
        STAGES,
        f"run.total_frames={24 * 64}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = events(proc.stderr)
    progress = [e for e in log if e["event"] == "progress"]
    assert len(progress) >= 2, [e["iteration"] for e in progress]
    assert [e["iteration"] for e in log if e["event"] == "evaluation"] == [1]
    last = progress[-1]
    assert (last["curriculum_stage"], last["curriculum_name"]) == (0, "near")
    assert last["level_pillars"] == [0, 2, 4]
    assert sum(last["level_shares"]) == pytest.approx(1.0, abs=1e-3)
    block = progress_table(last)
    assert "curriculum stage 0 (near)" in block and "envs by pillars 0:" in block
    rows = [json.loads(x) for x in (tmp_path / "s" / "history.jsonl").read_text().splitlines()]
    assert len(rows) == len(progress)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_bar_says_what_runs_inside_an_iteration(monkeypatch: pytest.MonkeyPatch) -> None:
    screen = Terminal()
    monkeypatch.setattr(sys, "stderr", screen)
    progress = ProgressLog(
        summary_interval=10,
        total_frames=1000,
        device="cpu",
        phase_labels={"collect": "collecting 128 steps"},
    )
    progress.phase("collect", True)
    progress.tick()
    assert "collecting 128 steps 0:00" in screen.getvalue()
    progress.phase("collect", False)
    progress.tick()
    progress.close()
