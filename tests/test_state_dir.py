"""A state dir the run cannot write is refused at start (exit 78 naming the path), not
trained on for ever with every checkpoint write failing."""

from __future__ import annotations

from pathlib import Path

import pytest

from navrl_daemon.errors import ConfigError
from navrl_daemon.storage.state_dir import check_writable
from tests.conftest import TINY, navrl_cli


def test_check_writable_names_the_directory_that_cannot_be_used(tmp_path: Path, read_only):
    state = tmp_path / "state"
    state.mkdir()
    check_writable(state, ["checkpoints", "eval"])  # missing parts are not made here
    assert not list(state.iterdir())  # no probe file, no empty dirs left
    (state / "checkpoints").mkdir()
    (state / "eval").mkdir()
    check_writable(state, ["checkpoints", "eval"])
    assert not [p for p in state.rglob("*") if p.name.startswith(".tmp-")]
    (state / "export").write_text("a file where a directory belongs")
    with pytest.raises(ConfigError, match=r"state/export: not a directory"):
        check_writable(state, ["checkpoints", "export"])
    read_only(state / "eval")
    with pytest.raises(ConfigError, match=r"state/eval: not writable: Read-only file system"):
        check_writable(state, ["checkpoints", "eval"])


def test_run_refuses_a_checkpoints_path_that_is_a_file(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "checkpoints").write_text("")
    proc = navrl_cli("run", "--state-dir", str(state), *TINY, "run.total_frames=128")
    assert proc.returncode == 78, proc.stderr[-2000:]
    assert f"{state / 'checkpoints'}: not a directory" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (state / "config.toml").exists()  # refused before anything was written


def test_run_refuses_a_read_only_checkpoints_dir(tmp_path: Path, read_only) -> None:
    state = tmp_path / "state"
    (state / "checkpoints").mkdir(parents=True)
    read_only(state / "checkpoints")
    proc = navrl_cli("run", "--state-dir", str(state), *TINY, "run.total_frames=128")
    assert proc.returncode == 78, proc.stderr[-2000:]
    assert f"{state / 'checkpoints'}: not writable: Read-only file system" in proc.stderr
