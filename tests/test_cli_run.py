"""`run` and `eval` as a user runs them: a real subprocess, real signals, real files."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import torch

from navrl_daemon.rl.policy import NavRLPolicy
from tests.conftest import TINY, navrl_cli


def test_run_to_total_frames_exports_navrl_layout(tmp_path: Path, navrl_checkpoint: Path) -> None:
    state = tmp_path / "state"
    proc = navrl_cli("run", "--state-dir", str(state), *TINY, "run.total_frames=256")
    assert proc.returncode == 0, proc.stderr
    # 8 envs x 8 steps = 64 frames per iteration: 4 iterations.
    lines = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    exported = [r for r in lines if r["event"] == "policy exported"]
    assert exported and exported[0]["iteration"] == 4 and exported[0]["frames"] == 256
    assert any(r["event"] == "progress" and "frames_per_second" in r for r in lines)
    assert [r["state"] for r in lines if r["event"] == "state"] == [
        "running",
        "draining",
        "stopped",
    ]
    exported = torch.load(state / "export" / "policy.pt", weights_only=True, map_location="cpu")
    reference = torch.load(navrl_checkpoint, weights_only=True, map_location="cpu")
    assert list(exported) == list(reference)
    assert all(exported[k].shape == reference[k].shape for k in reference)
    NavRLPolicy().load_state_dict(exported, strict=True)
    assert (state / "config.toml").read_text().startswith("[run]")


def test_run_writes_eval_results(tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc = navrl_cli(
        "run", "--state-dir", str(state), *TINY, "run.total_frames=128", "eval.interval=1"
    )
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(x) for x in (state / "eval" / "results.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2]
    assert all(0.0 <= r["reach_goal"] <= 1.0 and r["episodes"] == 4 for r in rows)


def test_eval_runs_the_published_checkpoint(navrl_checkpoint: Path) -> None:
    proc = navrl_cli(
        "eval",
        "--config",
        "config/navrl-original.toml",
        "--checkpoint",
        str(navrl_checkpoint),
        "--episodes",
        "8",
        "--json",
        "run.device=cpu",
        "eval.max_steps=400",
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["episodes"] == 8
    for key in ("reach_goal", "collision", "return", "episode_len"):
        assert isinstance(result[key], float)
    assert 0 < result["episode_len"] <= 400


def test_eval_human_readable(navrl_checkpoint: Path) -> None:
    proc = navrl_cli("eval", "--checkpoint", str(navrl_checkpoint), "--episodes", "4", *TINY)
    assert proc.returncode == 0, proc.stderr
    assert "reach_goal" in proc.stdout and "collision" in proc.stdout


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"not a torch file", "not a policy file (a torch state_dict) nor a checkpoint"),
        (None, "not NavRL's policy layout"),
    ],
)
def test_eval_bad_checkpoint_exits_65(tmp_path: Path, content: bytes | None, needle: str) -> None:
    path = tmp_path / "bad.pt"
    if content is None:
        torch.save({"some.weight": torch.zeros(3)}, path)
    else:
        path.write_bytes(content)
    proc = navrl_cli("eval", "--checkpoint", str(path), *TINY)
    assert proc.returncode == 65
    assert needle in proc.stderr


def test_eval_of_a_text_file_exits_65_without_torch_s_advice_to_unpickle_it() -> None:
    # torch's own message says to re-run with weights_only=False, i.e. to run the file's code
    proc = navrl_cli("eval", "--checkpoint", "README.md", *TINY)
    assert proc.returncode == 65
    [line] = [x for x in proc.stderr.splitlines() if x.strip()]
    assert line.startswith("navrl-daemon: error: checkpoint README.md: not a policy file")
    assert "weights_only` set to `False`" not in proc.stderr and "arbitrary code" not in proc.stderr


def test_eval_missing_checkpoint_exits_65(tmp_path: Path) -> None:
    proc = navrl_cli("eval", "--state-dir", str(tmp_path), *TINY)
    assert proc.returncode == 65
    assert "not found" in proc.stderr


def test_config_show_output_runs_as_config(tmp_path: Path) -> None:
    shown = navrl_cli("config", "show", *TINY, "run.total_frames=64")
    assert shown.returncode == 0, shown.stderr
    config = tmp_path / "shown.toml"
    config.write_text(shown.stdout)
    state = tmp_path / "state"
    proc = navrl_cli("run", "--config", str(config), "--state-dir", str(state))
    assert proc.returncode == 0, proc.stderr
    # The resolved config the run stored is the one it was given (show adds comments).
    stored = tomllib.loads((state / "config.toml").read_text())
    assert stored == tomllib.loads(shown.stdout)


def test_logs_are_json_lines_with_stage_and_iteration(tmp_path: Path) -> None:
    proc = navrl_cli(
        "run", "--state-dir", str(tmp_path), *TINY, "run.total_frames=192", "eval.interval=1"
    )
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in proc.stderr.splitlines()]  # every line is JSON
    assert all({"event", "level", "timestamp"} <= r.keys() for r in records)
    progress = [r for r in records if r["event"] == "progress"]
    assert [r["iteration"] for r in progress] == [1, 2, 3]
    assert all(r["stage"] == "trainer" for r in progress)
    evaluations = [r for r in records if r["event"] == "evaluation"]
    assert evaluations and all(
        r["stage"] == "evaluator" and r["iteration"] == r["policy_version"] for r in evaluations
    )
    summary = progress[-1]
    for phase in ("producer.collect", "trainer.update"):
        assert {"mean", "std", "min", "max"} <= summary["phases"][phase].keys()
