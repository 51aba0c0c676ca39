"""`torchrun --nproc-per-node 2 -m navrl_daemon run` on CPU (gloo): stop, resume, failure.

Real launcher, real processes, real signals. Each rank uses one thread, so the two ranks
fit this machine's two cores.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from navrl_daemon.storage.checkpoint import CheckpointDir
from navrl_daemon.testing import forked
from tests.conftest import REPO, SUBPROCESS_ENV, TINY, navrl_cli
from tests.distributed.ranks import free_port, rank_env

FRAMES_PER_ITERATION = 2 * 64  # two ranks x TINY's 8 envs x 8 steps
COMMON = ("checkpoint.interval=0", "eval.interval=4", "log.format=json", "log.summary_interval=1")


def launch(state: Path, *overrides: str, nproc: int = 2) -> subprocess.Popen[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
    cmd += [f"--master-port={port}", "-m", "navrl_daemon", "run", "--state-dir", str(state)]
    return subprocess.Popen(
        [*cmd, *TINY, *COMMON, *overrides],
        cwd=REPO,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=torchrun_env(state),
    )


def torchrun_env(state: Path) -> dict[str, str]:
    """SUBPROCESS_ENV with torchrun's temporary files (torchelastic_*) beside `state`."""
    tmp = state.with_name(state.name + "-tmp")
    tmp.mkdir(exist_ok=True)
    return {**SUBPROCESS_ENV, "TMPDIR": str(tmp)}


class Launched:
    """A torchrun whose ranks' JSON log lines are read as they come."""

    def __init__(self, state: Path, *overrides: str, nproc: int = 2) -> None:
        self.proc = launch(state, *overrides, nproc=nproc)
        self.events: list[dict] = []

    def wait_for(self, event: str, *, rank: int, count: int = 1) -> None:
        assert self.proc.stderr is not None
        seen = 0
        for line in self.proc.stderr:
            if not line.startswith("{"):
                continue  # the launcher's own log lines
            self.events.append(json.loads(line))
            e = self.events[-1]
            if e["event"] == event and e.get("rank", 0) == rank:
                seen += 1
                if seen == count:
                    return
        raise AssertionError(f"ended before rank {rank} logged {event!r}: {self.events[-8:]}")

    def finish(self, timeout: float = 90) -> int:
        assert self.proc.stderr is not None
        rest = self.proc.stderr.read()
        code = self.proc.wait(timeout=timeout)
        self.events += [json.loads(x) for x in rest.splitlines() if x.startswith("{")]
        return code

    def by_rank(self, event: str) -> dict[int, list[dict]]:
        out: dict[int, list[dict]] = {}
        for e in self.events:
            if e["event"] == event:
                out.setdefault(e.get("rank", 0), []).append(e)
        return out


def exported(state: Path) -> dict[str, torch.Tensor]:
    return torch.load(state / "export" / "policy.pt", weights_only=True)


def test_sigterm_to_launcher_then_resume_with_two_ranks_is_exact(tmp_path: Path) -> None:
    """SIGTERM to torchrun: both ranks stop after the same rollout and exit cleanly, rank 0
    writes one final checkpoint with both ranks' env states; two ranks resume from it and
    end bit for bit where an uninterrupted two-rank run ends."""
    run = Launched(tmp_path / "a", "run.total_frames=100000000")
    run.wait_for("progress", rank=1, count=4)
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish() != 0  # torchrun itself reports the signal it got
    stopped = run.by_rank("stopped")
    assert sorted(stopped) == [0, 1], run.events[-10:]  # both ranks ended without an error
    assert not run.by_rank("stage failed") and not run.by_rank("error")
    trained = {r: max(e["iteration"] for e in es) for r, es in run.by_rank("progress").items()}
    assert trained[0] == trained[1] >= 4  # the same number of updates on both ranks
    assert sorted(run.by_rank("policy exported")) == [0]  # rank 0 owns the state dir

    files = sorted((tmp_path / "a" / "checkpoints").glob("ckpt-*.nrc"))
    assert len(files) == 1
    _, header, state = CheckpointDir(tmp_path / "a" / "checkpoints").newest_valid()
    n = header.iteration
    assert n == trained[0]
    assert state["collector"]["world_size"] == 2 and len(state["collector"]["peers"]) == 1

    total = f"run.total_frames={(n + 5) * FRAMES_PER_ITERATION}"
    resumed = Launched(tmp_path / "a", total)
    assert resumed.finish() == 0, resumed.events[-10:]
    starts = resumed.by_rank("resumed from checkpoint")
    assert sorted(starts) == [0, 1]
    assert all(s[0]["iteration"] == n and s[0]["env_restored"] for s in starts.values())

    straight = Launched(tmp_path / "b", total)
    assert straight.finish() == 0
    a, b = exported(tmp_path / "a"), exported(tmp_path / "b")
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, different


def test_resume_with_another_world_size_keeps_the_model_and_reseeds_envs(tmp_path: Path) -> None:
    two = Launched(tmp_path / "s", f"run.total_frames={3 * FRAMES_PER_ITERATION}")
    assert two.finish() == 0
    frames = f"run.total_frames={4 * FRAMES_PER_ITERATION}"
    one = navrl_cli("run", "--state-dir", str(tmp_path / "s"), *TINY, *COMMON, frames)
    assert one.returncode == 0, one.stderr[-3000:]
    events = [json.loads(x) for x in one.stderr.splitlines() if x.startswith("{")]
    names = [e["event"] for e in events]
    assert any(n.startswith("world size changed since the checkpoint") for n in names)
    start = next(e for e in events if e["event"] == "resumed from checkpoint")
    assert (start["iteration"], start["env_restored"]) == (3, False)
    # One process now: 64 frames an iteration from 384 to 512 → iterations 4 and 5.
    assert max(e["iteration"] for e in events if e["event"] == "progress") == 5


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "hung"])
def test_a_killed_rank_makes_the_survivor_exit_nonzero_in_time(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """No launcher to clean up: rank 1 dies (SIGKILL: its sockets close) or hangs (SIGSTOP:
    only the collective timeout notices); rank 0 must exit non-zero, not hang."""
    port = free_port()
    args = ["run", "--state-dir", str(tmp_path / "k")]
    args += [*TINY, *COMMON, "run.total_frames=100000000", "distributed.timeout_s=10"]
    logs = [(tmp_path / f"rank{r}.log").open("w") for r in range(2)]
    procs = [forked.start(args, stderr=logs[r], env=rank_env(r, 2, port)) for r in range(2)]
    try:
        deadline = time.monotonic() + 120
        while '"event": "progress"' not in (tmp_path / "rank0.log").read_text():
            assert procs[0].poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        procs[1].send_signal(sig)
        t0 = time.monotonic()
        code = procs[0].wait(timeout=60)
        waited = time.monotonic() - t0
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert code != 0
    assert waited < 30, waited  # within distributed.timeout_s (and the stop that follows)
    text = (tmp_path / "rank0.log").read_text()
    events = [json.loads(x) for x in text.splitlines() if x[:1] == "{"]
    assert not [e for e in events if e["event"] == "stopped"]  # not a clean stop
    print(f"{sig.name}: rank 0 exited {code} after {waited:.1f} s: {text.splitlines()[-1]}")


def test_rank_0s_curriculum_promotion_reaches_every_rank_at_the_same_rollout(
    tmp_path: Path,
) -> None:
    """Only rank 0 evaluates; the ranks' stop vote carries the stage, so all apply it."""
    open_stage = "name = 'open', num_obstacles = 0, num_dynamic_obstacles = 0"
    curriculum = (
        f"env.curriculum=[{{{open_stage}, promote = {{reach_goal = 0.0, evals = 2}}}},"
        " {name = 'full'}]"
    )
    total = f"run.total_frames={10 * FRAMES_PER_ITERATION}"
    run = Launched(tmp_path / "c", curriculum, "eval.interval=1", "checkpoint.interval=5", total)
    assert run.finish() == 0, run.events[-10:]
    assert sorted(run.by_rank("curriculum promotion")) == [0]
    applied = run.by_rank("curriculum stage applied")
    assert sorted(applied) == [0, 1]
    assert [e["stage"] for e in applied[0]] == [e["stage"] for e in applied[1]] == [1]
    assert applied[0][0]["iteration"] == applied[1][0]["iteration"]
    _, _, state = CheckpointDir(tmp_path / "c" / "checkpoints").newest_valid()
    stages = [state["collector"]["curriculum"]["stage"]]
    stages += [peer["curriculum"]["stage"] for peer in state["collector"]["peers"]]
    assert stages == [1, 1]
