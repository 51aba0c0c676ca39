"""`navrl-daemon launch --nproc-per-node 2` on CPU (gloo): a real SIGTERM to the launcher
(what `systemctl stop` sends with KillMode=mixed) stops both ranks after the same rollout
with one valid final checkpoint, and the launcher exits 0 (torchrun run directly exits 1:
test_distributed_run.test_sigterm_to_launcher_then_resume_with_two_ranks_is_exact)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from navrl_daemon.storage.checkpoint import verify
from tests.conftest import REPO, TINY
from tests.distributed.ranks import free_port
from tests.distributed.test_distributed_run import COMMON, Launched, torchrun_env


class Launch(Launched):
    """`navrl-daemon launch` instead of torchrun, in a process group of its own as a
    terminal's job would be."""

    def __init__(self, state: Path) -> None:
        launch = [sys.executable, "-m", "navrl_daemon", "launch", "--nproc-per-node", "2"]
        torchrun = [f"--torchrun-args=--master-port={free_port()}"]
        self.proc = subprocess.Popen(
            [*launch, *torchrun, "--state-dir", str(state), *TINY, *COMMON],
            cwd=REPO,
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env=torchrun_env(state),
            start_new_session=True,
        )
        self.events: list[dict] = []


def test_sigterm_ends_both_ranks_cleanly_and_the_launcher_exits_0(tmp_path: Path) -> None:
    run = Launch(tmp_path)
    try:
        run.wait_for("progress", rank=1, count=2)
        run.proc.send_signal(signal.SIGTERM)
        code = run.finish(timeout=120)
    finally:
        if run.proc.poll() is None:
            os.killpg(run.proc.pid, signal.SIGKILL)
    assert code == 0, run.events[-10:]
    assert sorted(run.by_rank("stopped")) == [0, 1]
    assert sorted(run.by_rank("stop requested")) == [0, 1]
    files = sorted((tmp_path / "checkpoints").glob("ckpt-*.nrc"))
    assert len(files) == 1  # checkpoint.interval=0: the final one only
    assert verify(files) == [(files[0], None)]  # valid
    exported = run.by_rank("policy exported")[0][-1]
    assert files[0].name == f"ckpt-{exported['iteration']:09d}.nrc"
