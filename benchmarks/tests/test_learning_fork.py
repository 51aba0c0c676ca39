"""benchmarks/learning.py --fork-from: a lever measured against its control on the same
frames. The fork is a copy of a kept run as of its newest valid checkpoint (the source
may still be running: rows past the checkpoint, a torn newer checkpoint, its lock), and
the daemon then resumes the copy with the fork's overrides; the source is not touched."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import learning
import pytest

from navrl_daemon.testing import TINY
from navrl_daemon.testing.command_line import navrl_cli


@pytest.fixture(scope="module")
def kept_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run's state dir: 3 iterations of 64 frames, a checkpoint and an evaluation
    after each."""
    state = tmp_path_factory.mktemp("kept") / "run"
    done = navrl_cli(
        "run",
        "--state-dir",
        str(state),
        *TINY,
        "run.total_frames=192",
        "checkpoint.interval=1",
        "eval.interval=1",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return state


def as_if_still_running(state: Path) -> None:
    """What a running source holds beyond its newest checkpoint (iteration 3)."""
    with (state / "eval" / "results.jsonl").open("a") as f:
        f.write(json.dumps({"iteration": 4, "frames": 256, "reach_goal": 0.5}) + "\n")
        f.write('{"iteration": 5, "fra')  # torn: being written
    with (state / "history.jsonl").open("a") as f:
        f.write(json.dumps({"iteration": 4, "frames": 256}) + "\n")
    (state / "checkpoints" / "ckpt-000000005.nrc").write_bytes(b"half a checkpoint")
    (state / "lock").write_text("")


def rows(path: Path) -> list[int]:
    return [json.loads(line)["iteration"] for line in path.read_text().splitlines()]


def test_a_fork_is_the_source_as_of_its_newest_valid_checkpoint(
    kept_run: Path, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    shutil.copytree(kept_run, src)
    as_if_still_running(src)
    src.with_name("src.launches.jsonl").write_text("[1.0, 2.0]\n")
    before = {p: p.read_bytes() for p in src.rglob("*") if p.is_file()}
    dst = tmp_path / "fork"
    assert learning.fork_state(src, dst) == 3
    assert rows(dst / "history.jsonl") == rows(kept_run / "history.jsonl")
    assert max(rows(dst / "history.jsonl")) == 3
    # (which versions were evaluated depends on the load: the evaluator coalesces)
    assert rows(dst / "eval" / "results.jsonl") == rows(kept_run / "eval" / "results.jsonl")
    assert not (dst / "lock").exists()
    assert dst.with_name("fork.launches.jsonl").read_text() == "[1.0, 2.0]\n"
    assert {p: p.read_bytes() for p in src.rglob("*") if p.is_file()} == before
    # The daemon resumes the fork at the checkpoint, with the fork's own override.
    resumed = navrl_cli(
        "run",
        "--state-dir",
        str(dst),
        *TINY,
        "run.total_frames=256",
        "ppo.epochs=2",
        "run.allow_config_change=true",
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert '"iteration": 3' in next(
        line for line in resumed.stderr.splitlines() if "resumed from checkpoint" in line
    )


def test_a_source_without_a_valid_checkpoint_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "checkpoints").mkdir(parents=True)
    (src / "checkpoints" / "ckpt-000000001.nrc").write_bytes(b"torn")
    with pytest.raises(ValueError, match=r"no valid checkpoint to fork from \(valid: none\)"):
        learning.fork_state(src, tmp_path / "fork")
    assert not (tmp_path / "fork").exists()


def test_fork_at_forks_as_of_an_older_checkpoint(kept_run: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(kept_run, src)
    as_if_still_running(src)
    before = {p: p.read_bytes() for p in src.rglob("*") if p.is_file()}
    dst = tmp_path / "fork"
    assert learning.fork_state(src, dst, at=2) == 2
    assert [p.name for p in sorted((dst / "checkpoints").glob("*.nrc"))] == [
        "ckpt-000000001.nrc",
        "ckpt-000000002.nrc",
    ]
    assert max(rows(dst / "history.jsonl")) == 2
    assert all(i <= 2 for i in rows(dst / "eval" / "results.jsonl"))
    assert {p: p.read_bytes() for p in src.rglob("*") if p.is_file()} == before
    resumed = navrl_cli("run", "--state-dir", str(dst), *TINY, "run.total_frames=192")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert '"iteration": 2' in next(
        line for line in resumed.stderr.splitlines() if "resumed from checkpoint" in line
    )


def test_fork_at_an_iteration_without_a_valid_checkpoint_is_refused(
    kept_run: Path, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    shutil.copytree(kept_run, src)
    (src / "checkpoints" / "ckpt-000000002.nrc").write_bytes(b"torn")
    for at in (2, 7):  # torn; none of that iteration (the newest, 3, is not taken instead)
        # The message names the iterations there are (2 is torn).
        message = rf"no valid checkpoint of iteration {at} to fork from \(valid: 1, 3\)"
        with pytest.raises(ValueError, match=message):
            learning.fork_state(src, tmp_path / "fork", at=at)
        assert not (tmp_path / "fork").exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--resume"], "leave out --resume"),
        ([], "name a new folder"),  # --keep-state exists
    ],
)
def test_bad_fork_arguments_exit_2_before_anything_runs(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    message: str,
) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    argv = ["learning.py", "--fork-from", str(src), "--keep-state", str(dst), *extra]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exited:
        learning.main()
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_fork_at_needs_fork_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["learning.py", "--fork-at", "3", "--keep-state", str(tmp_path / "dst")]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exited:
        learning.main()
    assert exited.value.code == 2
    assert "--fork-at ITER picks the checkpoint of --fork-from SRC" in capsys.readouterr().err
