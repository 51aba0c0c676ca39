"""A run that survives its machine: with `checkpoint.mirror` the daemon keeps its resume
point in a second place, and a run whose state dir is empty or behind goes on from it,
exactly where it stopped.

Real daemons (navrl_daemon/testing/forked.py), a real SIGTERM, real files, a real git
repository. The run is deterministic: resumed from its mirror it evaluates and trains as it
would have resumed from its own state dir, bit for bit.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from navrl_daemon.storage.run_mirror import POINTER
from navrl_daemon.testing.daemon_process import Daemon
from tests.conftest import TINY, navrl_cli
from tests.storage.test_run_mirror import kill_mid_write
from tests.test_resume import FRAMES_PER_ITERATION, exported, run

COMMON = ("eval.interval=2", "checkpoint.interval=3")
# What an evaluation found and what an update did: no clock in them.
EVALUATED = ("iteration", "frames", "episodes", "return", "reach_goal", "collision")
TRAINED = ("iteration", "frames", "actor_loss", "critic_loss", "entropy_loss")


@dataclass(frozen=True)
class Stopped:
    """A run stopped with SIGTERM after `iteration` iterations, its mirror, and the same
    run resumed from a copy of its state dir to `total` (what a mirror resume must give)."""

    mirror: Path
    iteration: int
    total: str
    reference: Path
    later: Path  # the reference's newest checkpoint: a newer point to tear


def rows(path: Path, keys: tuple[str, ...], after: int) -> list[dict]:
    found = [json.loads(line) for line in path.read_text().splitlines()]
    return [{k: r.get(k) for k in keys} for r in found if r["iteration"] > after]


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> Stopped:
    root = tmp_path_factory.mktemp("mirrored")
    state, mirror = root / "state", root / "mirror"
    d = Daemon(state, *COMMON, f"checkpoint.mirror={mirror}", "run.total_frames=100000000")
    d.wait_for("progress", count=5)
    d.proc.send_signal(signal.SIGTERM)
    code, _ = d.finish()
    assert code == 0, d.events[-5:]
    n = next(e["iteration"] for e in d.events if e["event"] == "policy exported")
    mirrored = [e["iteration"] for e in d.events if e["event"] == "mirror written"]
    assert mirrored[-1] == n  # the stop's own checkpoint, with what came after it
    assert json.loads((mirror / POINTER).read_bytes())["iteration"] == n
    reference = root / "reference"
    shutil.copytree(state, reference)
    total = f"run.total_frames={(n + 5) * FRAMES_PER_ITERATION}"
    start = next(e for e in run(reference, *COMMON, total) if e["event"].startswith("resumed"))
    assert (start["iteration"], start["env_restored"]) == (n, True)
    later = sorted((reference / "checkpoints").glob("ckpt-*.nrc"))[-1]
    return Stopped(mirror, n, total, reference, later)


def resume_from(mirror: Path | str, state: Path, s: Stopped) -> list[dict]:
    """Run on `state` (empty, or behind) with `mirror`; check it went on from the mirror
    at the stop's iteration and then did exactly what the reference did."""
    log = run(state, *COMMON, f"checkpoint.mirror={mirror}", s.total)
    restored = next(e for e in log if e["event"].startswith("resume point restored"))
    start = next(e for e in log if e["event"] == "resumed from checkpoint")
    assert restored["iteration"] == start["iteration"] == s.iteration
    assert start["env_restored"]
    results = "eval/results.jsonl"
    assert rows(state / results, EVALUATED, 0) == rows(s.reference / results, EVALUATED, 0)
    ours = rows(state / "history.jsonl", TRAINED, 0)
    assert ours == rows(s.reference / "history.jsonl", TRAINED, 0)
    assert rows(state / results, EVALUATED, s.iteration)  # evaluations after the stop
    a, b = exported(state), exported(s.reference)
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    return log


def test_a_run_whose_state_dir_is_gone_resumes_from_its_mirror_alone(
    stopped: Stopped, tmp_path: Path
) -> None:
    mirror = tmp_path / "mirror"
    shutil.copytree(stopped.mirror, mirror)
    resume_from(mirror, tmp_path / "new-machine-state", stopped)


def test_a_state_dir_behind_its_mirror_resumes_from_the_mirror(
    stopped: Stopped, tmp_path: Path
) -> None:
    """An older state dir (its newest checkpoint lost with a disk, say), and the mirror
    named by an fsspec URL: fsspec's own local file system, in the daemon's process."""
    mirror, state = tmp_path / "mirror", tmp_path / "state"
    shutil.copytree(stopped.mirror, mirror)
    shutil.copytree(stopped.reference.parent / "state", state)
    for newer in sorted((state / "checkpoints").glob("ckpt-*.nrc"))[1:]:
        newer.unlink()
    log = resume_from(f"local://{mirror}", state, stopped)
    restored = next(e for e in log if e["event"].startswith("resume point restored"))
    assert restored["event"].endswith("the state dir was behind")
    assert restored["state_dir_iteration"] == 3 < stopped.iteration


def test_a_fresh_clone_of_a_repository_holding_the_mirror_resumes_the_run(
    stopped: Stopped, tmp_path: Path
) -> None:
    repo, clone = tmp_path / "repo", tmp_path / "clone"
    shutil.copytree(stopped.mirror, repo / "runs" / "seed0")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@localhost"]
    for args in (["init", "-q", str(repo)], ["-C", str(repo), "add", "-A"]):
        subprocess.run([*git, *args], check=True)
    subprocess.run([*git, "-C", str(repo), "commit", "-q", "-m", "resume point"], check=True)
    subprocess.run([*git, "clone", "-q", str(repo), str(clone)], check=True)
    resume_from(clone / "runs" / "seed0", tmp_path / "state", stopped)


def test_a_torn_mirror_write_never_replaces_the_good_point(
    stopped: Stopped, tmp_path: Path
) -> None:
    """A newer point copied in full by a process killed before it switched MIRROR.json:
    the run still resumes from the good one, and its first mirror write removes the torn."""
    mirror = tmp_path / "mirror"
    shutil.copytree(stopped.mirror, mirror)
    kill_mid_write(mirror, stopped.reference, stopped.later)
    torn = sorted(p.name for p in mirror.glob("point-*"))
    assert len(torn) == 2
    log = resume_from(mirror, tmp_path / "state", stopped)
    removed = [r for e in log if e["event"] == "mirror written" for r in e.get("removed", [])]
    assert set(torn) <= set(removed)


def test_a_mirror_that_cannot_be_written_never_stops_training(tmp_path: Path, read_only) -> None:
    (tmp_path / "mirror").mkdir()
    mirror = read_only(tmp_path / "mirror")
    log = run(
        tmp_path / "state",
        "checkpoint.interval=2",
        f"checkpoint.mirror={mirror}",
        f"run.total_frames={6 * FRAMES_PER_ITERATION}",
    )
    failed = [e for e in log if e["event"].startswith("mirror write failed")]
    assert [e["checkpoint"] for e in failed][:3] == [f"ckpt-00000000{i}.nrc" for i in (2, 4, 6)]
    assert all("Read-only file system" in e["error"] for e in failed)
    assert failed[-1]["failures"] == len(failed)
    assert any(e["event"] == "policy exported" and e["iteration"] == 6 for e in log)
    assert list(mirror.iterdir()) == []


def test_a_state_dir_ahead_of_its_mirror_is_used_and_a_corrupt_mirror_refused(
    stopped: Stopped, tmp_path: Path
) -> None:
    mirror = tmp_path / "mirror"
    shutil.copytree(stopped.mirror, mirror)
    state = tmp_path / "state"
    shutil.copytree(stopped.reference, state)
    log = run(state, *COMMON, f"checkpoint.mirror={mirror}", stopped.total)
    assert any(e["event"].startswith("state dir is not behind its mirror") for e in log)
    assert not any(e["event"].startswith("resume point restored") for e in log)

    point = json.loads((mirror / POINTER).read_bytes())
    history = mirror / point["folder"] / "history.jsonl"
    history.write_bytes(history.read_bytes()[:-10])
    empty = tmp_path / "empty"
    proc = navrl_cli(
        "run", "--state-dir", str(empty), *TINY, f"checkpoint.mirror={mirror}", stopped.total
    )
    assert proc.returncode == 65, proc.stderr[-2000:]
    assert "history.jsonl" in proc.stderr and "do not match MIRROR.json" in proc.stderr
    assert not (empty / "checkpoints").exists() or not list((empty / "checkpoints").iterdir())
