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
from navrl_daemon.ops.intervals import share_interval
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
    """Two OpenMP threads on a shared 2-core CPU collapse throughput (docs/results.md)."""
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
    # An override by a key's old name wins over the stored config's new one.
    assert eval_json("--checkpoint", str(alone), "eval.num_envs=3", "env.spawn=border")
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
    assert set(counts) == {"reached", "collided", "out of bounds", "timed out"}
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
    lo, hi = share_interval(last["reach_goal"], last["episodes"])
    assert f"(95 %: {lo:.2f}–{hi:.2f})" in proc.stdout  # how far its drones may be off


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


def test_tensorboard_holds_the_history_scalars(run_dir: Path) -> None:
    """Every number of every history.jsonl row is a TensorBoard point at step = frames, and
    every evaluation is under eval/."""
    acc_module = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    from navrl_daemon.ops.tensorboard import history_tag, scalars

    acc = acc_module.EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    board = {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}
    rows = [json.loads(x) for x in (run_dir / "history.jsonl").read_text().splitlines()]
    expected = {
        (history_tag(k), r["frames"]): v
        for r in rows
        for k, v in scalars(r).items()
        if history_tag(k) is not None
    }
    assert len(expected) > 20 * len(rows) // 2
    got = {(tag, step): board.get(tag, {}).get(step) for tag, step in expected}
    assert got == pytest.approx(expected, rel=1e-6, abs=1e-9)  # float32 in the event file
    evals = [json.loads(x) for x in (run_dir / "eval" / "results.jsonl").read_text().splitlines()]
    assert sorted(board["eval/reach_goal"]) == [e["frames"] for e in evals]


def test_report_embeds_the_episode_video_and_shows_config_changes(
    run_dir: Path, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    shutil.copytree(run_dir, state)
    # A resume with a changed setting keeps the earlier config (one more iteration to train;
    # a finished run started again writes nothing).
    more = ["run.total_frames=448", "ppo.entropy_coef=0.01", "run.allow_config_change=true"]
    proc = navrl_cli("run", "--state-dir", str(state), *RUN, *more)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(list((state / "configs").glob("config-*.toml"))) == 1
    out = tmp_path / "report"
    proc = navrl_cli("report", "--state-dir", str(state), "--out", str(out), "--episodes", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = (out / "report.html").read_text()
    assert 'src="data:image/gif;base64,' in page
    assert "-entropy_coef = 0.001" in page and "+entropy_coef = 0.01" in page
    from PIL import Image

    with Image.open(out / "episodes.gif") as gif:
        assert gif.size == (640, 320) and 2 <= gif.n_frames <= 120


def test_export_onnx_from_the_cli_runs_in_onnx_runtime(run_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("onnxscript", reason="the export extra: pip install '.[export]'")
    ort = pytest.importorskip("onnxruntime", reason="the export extra: pip install '.[export]'")
    import numpy as np

    out = tmp_path / "policy.onnx"
    proc = navrl_cli(
        *("checkpoints", "export", "--state-dir", str(run_dir), "--format", "onnx"),
        *("--out", str(out)),
        process=True,  # torch's log handlers write to the process's own stderr
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # No warnings that are not the user's business (torchvision ops, torch deprecations).
    assert "torchvision" not in proc.stderr and "Warning" not in proc.stderr, proc.stderr
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    assert names == ["state", "lidar", "direction", "dynamic_obstacle"]
    feeds = {
        i.name: np.random.default_rng(0).random([3, *i.shape[1:]], dtype=np.float32)
        for i in session.get_inputs()
    }
    action, normalized = session.run(None, feeds)
    assert action.shape == (3, 1, 3) and ((normalized > 0) & (normalized < 1)).all()


@pytest.mark.parametrize("suffix", [".gif", ".mp4"])
def test_eval_video_is_written_and_bad_suffixes_exit_2(
    run_dir: Path, tmp_path: Path, suffix: str
) -> None:
    video = tmp_path / f"episodes{suffix}"
    proc = navrl_cli("eval", "--state-dir", str(run_dir), "--video", str(video), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["video"] == str(video)
    head = video.read_bytes()[:12]
    assert head.startswith(b"GIF89a") if suffix == ".gif" else head[4:8] == b"ftyp"
    bad = navrl_cli("eval", "--state-dir", str(run_dir), "--video", str(tmp_path / "x.avi"))
    assert bad.returncode == 2 and "--video" in bad.stderr


def test_the_way_to_the_command_is_told(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After `make run` the command is not on PATH: the README says where it is, and the
    end-of-run summary spells every next command the way this one was started."""
    from navrl_daemon.commands.run_summary import command_prefix

    setup = (REPO / "README.md").read_text().split("## Commands")[0]
    assert ".venv/bin/navrl-daemon" in setup and "source .venv/bin/activate" in setup

    script = tmp_path / ".venv" / "bin" / "navrl-daemon"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(script), "run"])
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert command_prefix() == ".venv/bin/navrl-daemon"
    monkeypatch.setenv("PATH", f"{script.parent}:/usr/bin")
    assert command_prefix() == "navrl-daemon"
    monkeypatch.setattr(sys, "argv", ["/x/navrl_daemon/__main__.py", "run"])
    assert command_prefix().endswith(" -m navrl_daemon")


def test_the_summary_s_tensorboard_command_runs_as_printed(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make` installs tensorboard in .venv/bin, which is not on PATH unless the venv is
    activated: the summary names it by its path then, and the command runs as printed."""
    import shlex

    from navrl_daemon.commands.run_summary import run_summary
    from navrl_daemon.config import Config

    monkeypatch.chdir(REPO)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no venv on it
    command = run_summary(Config(), run_dir)["tensorboard"]
    program, *args = shlex.split(command)
    assert args == ["--logdir", str(run_dir / "tensorboard")]
    assert shutil.which(program) is None or "/" in program  # not left to a PATH without it
    done = subprocess.run([program, "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "--logdir" in done.stdout
