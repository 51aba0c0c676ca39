"""What a new user meets in the first hour, each as a user runs it (issue #24's list):
the shipped config's thread count, `eval` that evaluates a run with that run's config,
readable `eval --plot` output, `config show` that says where its values come from and what
each key means, a `status` that does not load torch and shows the latest evaluation, the
best policy kept and exported, report files others can read."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from navrl_daemon.cli import main
from navrl_daemon.config import load_config
from tests.conftest import REPO, SUBPROCESS_ENV, TINY, navrl_cli

# The tiny task differs from the built-in defaults (NavRL's scale) in every key eval uses.
RUN = [*TINY, "run.total_frames=384", "eval.interval=2", "checkpoint.interval=2"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state dir after 6 tiny iterations, evaluated and checkpointed every 2nd."""
    state = tmp_path_factory.mktemp("first-hour") / "state"
    proc = navrl_cli("run", "--state-dir", str(state), *RUN)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return state


def test_shipped_cpu_config_uses_one_torch_thread() -> None:
    """Two OpenMP threads on a shared 2-core CPU collapse throughput (docs/learning.md)."""
    assert load_config(REPO / "config" / "default.toml").run.torch_threads == 1


def eval_json(*args: str) -> dict:
    proc = navrl_cli("eval", "--json", *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_eval_of_a_state_dir_uses_that_runs_config(run_dir: Path) -> None:
    # Built-in defaults would evaluate 64 drones on NavRL's crossing layout.
    doc = eval_json("--state-dir", str(run_dir))
    assert doc["episodes"] == 4 and doc["layout"] == "train"
    assert doc["config"].startswith(str(run_dir / "config.toml"))
    assert doc["checkpoint"] == str(run_dir / "export" / "policy.pt")


def test_eval_of_a_checkpoint_file_uses_its_runs_config(run_dir: Path, tmp_path: Path) -> None:
    nrc = sorted((run_dir / "checkpoints").glob("ckpt-*.nrc"))[-1]
    assert eval_json("--checkpoint", str(nrc))["episodes"] == 4
    # Copied out of its state dir, a .nrc still carries its run's config.
    alone = shutil.copy(nrc, tmp_path / nrc.name)
    doc = eval_json("--checkpoint", str(alone), "eval.num_envs=3")
    assert doc["episodes"] == 3 and doc["layout"] == "train"
    assert doc["config"] == f"the config stored in {alone}"
    # An explicit --config still wins.
    doc = eval_json("--checkpoint", str(nrc), "--config", "config/default.toml", "--episodes", "2")
    assert doc["episodes"] == 2 and doc["config"] == "config/default.toml"


def test_eval_plot_prints_outcome_counts_as_words(run_dir: Path, tmp_path: Path) -> None:
    png = tmp_path / "paths.png"
    proc = navrl_cli("eval", "--state-dir", str(run_dir), "--plot", str(png))
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.strip().startswith("outcomes:"))
    assert "{" not in line and "'" not in line
    counts = dict(part.strip().rsplit(" ", 1) for part in line.split(":", 1)[1].split(","))
    assert set(counts) == {"reached", "collided", "timed out"}
    assert sum(int(v) for v in counts.values()) == 4
    assert "evaluating" in proc.stderr and "4 drones" in proc.stderr


def test_config_show_says_where_values_come_from_and_what_keys_mean(run_dir: Path) -> None:
    built_in = navrl_cli("config", "show")
    assert built_in.returncode == 0
    head = built_in.stdout.split("[run]")[0]
    assert "built-in defaults" in head and "config/default.toml" in head
    lines = built_in.stdout.splitlines()
    # Every key line is preceded by its description comment.
    keys = [i for i, x in enumerate(lines) if " = " in x and not x.startswith("#")]
    undescribed = [lines[i] for i in keys if not lines[i - 1].startswith("#")]
    assert undescribed == []
    i = next(i for i in keys if lines[i].startswith("keep_best"))
    assert "best eval reach_goal" in lines[i - 2] + lines[i - 1]

    of_run = navrl_cli("config", "show", "--state-dir", str(run_dir))
    assert of_run.returncode == 0, of_run.stderr
    assert str(run_dir / "config.toml") in of_run.stdout.splitlines()[0]
    assert "num_envs = 8" in of_run.stdout  # TINY's, not NavRL's 1024
    assert navrl_cli("config", "show", "--state-dir", str(run_dir.parent)).returncode == 2


def test_status_loads_no_torch_and_shows_the_latest_evaluation(run_dir: Path) -> None:
    code = (
        "import sys\n"
        "from navrl_daemon.cli import main\n"
        f"rc = main(['status', '--state-dir', {str(run_dir)!r}])\n"
        "heavy = sorted(m for m in ('torch', 'h5py', 'matplotlib') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
        "sys.exit(rc)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=SUBPROCESS_ENV
    )
    assert proc.returncode == 3, proc.stderr  # not running
    assert "HEAVY []" in proc.stdout
    last = json.loads((run_dir / "eval" / "results.jsonl").read_text().splitlines()[-1])
    assert f"last eval: iteration {last['iteration']}, reach_goal" in proc.stdout


def test_best_policy_is_exported_listed_and_exportable(run_dir: Path, tmp_path: Path) -> None:
    results = [json.loads(x) for x in (run_dir / "eval" / "results.jsonl").read_text().splitlines()]
    best_record = json.loads((run_dir / "export" / "best.json").read_text())
    from navrl_daemon.rl.evaluate import eval_rank

    assert best_record["iteration"] == max(results, key=eval_rank)["iteration"]
    assert (run_dir / "export" / "best.pt").stat().st_size > 0

    listed = json.loads(
        navrl_cli("checkpoints", "list", "--state-dir", str(run_dir), "--json").stdout
    )
    assert [e["eval"] is not None for e in listed] == [
        e["iteration"] in {r["iteration"] for r in results} for e in listed
    ]
    assert sum(e["best"] for e in listed) == 1
    text = navrl_cli("checkpoints", "list", "--state-dir", str(run_dir)).stdout
    assert "eval reach/coll." in text.splitlines()[0] and " best " in text

    out = tmp_path / "best.pt"
    proc = navrl_cli(
        "checkpoints", "export", "--state-dir", str(run_dir), "--best", "--out", str(out)
    )
    assert proc.returncode == 0, proc.stderr
    best_listed = next(e for e in listed if e["best"])
    assert f"(iteration {best_listed['iteration']})" in proc.stdout


def test_report_files_follow_the_umask(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    old = os.umask(0o022)
    try:
        assert (
            main(["report", "--state-dir", str(run_dir), "--out", str(out), "--no-trajectories"])
            == 0
        )
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
    assert modes and set(modes.values()) == {0o644}, modes
