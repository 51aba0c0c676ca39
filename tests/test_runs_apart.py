"""Two configs never share a state dir by accident: without --state-dir a run lives in
`runs/<config stem>`, and a resume whose task, algorithm or seed differ from the
checkpoint's is refused (exit 78, the keys listed) unless run.allow_config_change is set."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from navrl_daemon.config import load_config
from tests.conftest import TINY, navrl_cli

REPO = Path(__file__).resolve().parents[1]


def events(proc_stderr: str) -> list[dict]:
    return [json.loads(x) for x in proc_stderr.splitlines() if x.startswith("{")]


def test_the_state_dir_derives_from_the_config_name(tmp_path: Path) -> None:
    cfg = tmp_path / "my-task.toml"
    cfg.write_text("[env]\nnum_envs = 8\n")
    assert load_config(cfg, environ={}).run.state_dir == "runs/my-task"
    assert load_config(REPO / "config/navrl.toml", environ={}).run.state_dir == "runs/navrl"
    assert load_config(REPO / "config/default.toml", environ={}).run.state_dir == "runs/default"
    # Set anywhere, it wins.
    assert load_config(cfg, ["run.state_dir=elsewhere"], environ={}).run.state_dir == "elsewhere"
    cfg.write_text('[run]\nstate_dir = "here"\n')
    assert load_config(cfg, environ={}).run.state_dir == "here"


def test_two_configs_without_state_dir_train_apart(tmp_path: Path) -> None:
    for name in ("small", "other"):
        shutil.copy(REPO / "config/default.toml", tmp_path / f"{name}.toml")
    first = navrl_cli("run", "--config", "small.toml", *TINY, "run.total_frames=64", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    second = navrl_cli(
        "run",
        "--config",
        "other.toml",
        *TINY,
        "env.num_obstacles=2",
        "run.total_frames=64",
        cwd=tmp_path,
    )
    assert second.returncode == 0, second.stderr[-3000:]
    assert not [e for e in events(second.stderr) if e["event"] == "resumed from checkpoint"]
    for name in ("small", "other"):
        assert list((tmp_path / "runs" / name / "checkpoints").glob("*.nrc")), name


def test_a_resume_with_another_task_is_refused_unless_allowed(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = navrl_cli("run", "--state-dir", str(state), *TINY, "run.total_frames=64")
    assert first.returncode == 0, first.stderr[-3000:]
    config_before = (state / "config.toml").read_text()

    changed = ["env.num_obstacles=2", "ppo.entropy_coef=0.01", "run.seed=3"]
    refused = navrl_cli("run", "--state-dir", str(state), *TINY, *changed, "run.total_frames=128")
    assert refused.returncode == 78, refused.stderr[-3000:]
    for key in ("env.num_obstacles", "ppo.entropy_coef", "run.seed"):
        assert key in refused.stderr
    assert "run.allow_config_change" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert (state / "config.toml").read_text() == config_before  # nothing replaced

    # Execution modes are not the task: switching them resumes as before.
    same = navrl_cli(
        "run", "--state-dir", str(state), *TINY, "ppo.update_path=eager", "run.total_frames=128"
    )
    assert same.returncode == 0, same.stderr[-3000:]

    allowed = navrl_cli(
        "run",
        "--state-dir",
        str(state),
        *TINY,
        *changed,
        "run.allow_config_change=true",
        "run.total_frames=192",
    )
    assert allowed.returncode == 0, allowed.stderr[-3000:]
    [start] = [e for e in events(allowed.stderr) if e["event"] == "resumed from checkpoint"]
    assert start["iteration"] == 2 and start["env_restored"] is False
    [changed_line] = [
        e for e in events(allowed.stderr) if e["event"] == "config changed since the checkpoint"
    ]
    assert set(changed_line["keys"]) == {"env.num_obstacles", "ppo.entropy_coef", "run.seed"}
