"""A file being read never chooses the code that runs: `env.backend = "module:factory"` in
a checkpoint's stored config or a state dir's `config.toml` is refused (exit 78, saying
how to name it yourself) by `eval` and `report`, where it was imported and called, from
the working directory too under `python -m navrl_daemon`. A built-in or installed
(entry point) backend stored there is honoured; one the user names is imported.

Each crafted module writes a marker file when imported: no marker, no code ran."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from navrl_daemon.testing.crafted_config import (
    BACKEND,
    checkpoint_naming,
    plant_module,
    run_config_naming,
)
from tests.conftest import navrl_cli


def assert_refused(proc, marker: Path, source: str) -> None:  # type: ignore[no-untyped-def]
    assert proc.returncode == 78, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"{source} names env.backend = '{BACKEND}'" in proc.stderr, proc.stderr
    assert f"env.backend={BACKEND}" in proc.stderr  # how to run it, if trusted
    assert not marker.exists(), "the stored backend's module was imported"


def test_eval_of_a_checkpoint_naming_a_module_runs_none_of_it(tmp_path: Path) -> None:
    marker = plant_module(tmp_path)
    ckpt = checkpoint_naming(tmp_path / "shared.nrc", BACKEND)
    # From the module's folder, as `python -m navrl_daemon` (which imports from there).
    proc = navrl_cli("eval", "--checkpoint", str(ckpt), cwd=tmp_path)
    assert_refused(proc, marker, f"the config stored in {ckpt}")

    # Named by the user, on the command line: their choice, imported.
    mine = navrl_cli("eval", "--checkpoint", str(ckpt), f"env.backend={BACKEND}", cwd=tmp_path)
    assert marker.read_text() == "ran", mine.stderr[-2000:]


def test_eval_and_report_of_a_state_dir_naming_a_module_run_none_of_it(tmp_path: Path) -> None:
    marker = plant_module(tmp_path)
    state = tmp_path / "state"
    ckpt = checkpoint_naming(state / "checkpoints" / "ckpt-000000001.nrc", "navigation")
    run_config_naming(state, BACKEND)
    (state / "eval").mkdir()
    (state / "eval" / "results.jsonl").write_text(
        json.dumps({"iteration": 1, "frames": 64, "reach_goal": 0.5, "collision": 0.0}) + "\n"
    )
    run_config = f"{state / 'config.toml'} (the run's config)"
    proc = navrl_cli("eval", "--checkpoint", str(ckpt), cwd=tmp_path)
    assert_refused(proc, marker, run_config)

    report = navrl_cli("report", "--state-dir", str(state), "--json", cwd=tmp_path)
    assert report.returncode == 0, report.stderr[-3000:]
    assert not marker.exists(), "report imported the state dir's backend"
    page = (state / "report" / "report.html").read_text()
    assert f"not drawn: {state / 'config.toml'} names env.backend = &#x27;{BACKEND}" in page


@pytest.mark.parametrize("backend", ["navigation", "navrl-2d"])
def test_a_stored_built_in_or_installed_backend_is_honoured(tmp_path: Path, backend: str) -> None:
    ckpt = checkpoint_naming(tmp_path / "ok.nrc", backend)
    proc = navrl_cli("eval", "--checkpoint", str(ckpt), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["episodes"] == 4
