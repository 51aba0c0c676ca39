"""`eval` with a config other than the one the policy's run trained with says so: which
task or algorithm keys differ (a policy flown on another task, on purpose or not)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import TINY, navrl_cli


def test_eval_names_the_keys_its_config_changes(tmp_path: Path) -> None:
    state = tmp_path / "state"
    done = navrl_cli("run", "--state-dir", str(state), *TINY, "run.total_frames=64")
    assert done.returncode == 0, done.stderr[-2000:]
    policy = str(state / "export" / "policy.pt")
    quick = ["--episodes", "2", "eval.max_steps=10"]

    other = navrl_cli("eval", "--config", "config/default.toml", "--checkpoint", policy, *quick)
    assert other.returncode == 0, other.stderr[-2000:]
    assert "differs from the one" in other.stderr
    assert "env.num_obstacles" in other.stderr and str(state / "config.toml") in other.stderr

    own = navrl_cli("eval", "--config", str(state / "config.toml"), "--checkpoint", policy, *quick)
    assert own.returncode == 0, own.stderr[-2000:]
    assert "differs from the one" not in own.stderr
