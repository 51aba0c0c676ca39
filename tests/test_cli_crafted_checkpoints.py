"""Crafted checkpoints in a real state dir, as a user meets them: `checkpoints verify` exits
65 naming each, and `run` moves them aside and resumes from the newest valid one (issue
#69: a NaN weight passed `verify` and `run` rolled back to it until it exited 1; a frame
claiming an exabyte killed both with a MemoryError)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from navrl_daemon.storage import checkpoint
from navrl_daemon.storage.checkpoint import CheckpointDir, encode_checkpoint, load_checkpoint
from tests.conftest import TINY, navrl_cli
from tests.storage.test_crafted_checkpoints import exabyte_frame, exabyte_payload
from tests.test_cli_checkpoints import run_resumes_past_4_to_6

WEIGHT = "actor.module.0.module.alpha_layer.weight"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state dir after 3 iterations with a checkpoint each."""
    state = tmp_path_factory.mktemp("trained") / "state"
    proc = navrl_cli(
        "run", "--state-dir", str(state), *TINY, "run.total_frames=192", "checkpoint.interval=1"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return state


def write_nan_weight(directory: CheckpointDir, src: Path, iteration: int) -> Path:
    """`src` with one policy weight NaN, written by the project's own writer with its
    finiteness guard off (as a writer without the guard would have)."""
    header, state = load_checkpoint(src)
    state["learner"]["policy"][WEIGHT][0, 0] = float("nan")
    with pytest.MonkeyPatch.context() as unguarded:
        unguarded.setattr(checkpoint, "_all_finite", lambda t: True)
        data = encode_checkpoint(
            state, iteration=iteration, frames=header.frames, policy_version=iteration
        )
    return directory.write(data, iteration)


def test_verify_refuses_crafted_files_and_run_resumes_past_them(
    trained: Path, tmp_path: Path
) -> None:
    state = Path(shutil.copytree(trained, tmp_path / "state"))
    ckpts = CheckpointDir(state / "checkpoints")
    write_nan_weight(ckpts, ckpts.path / "ckpt-000000003.nrc", 4)
    (ckpts.path / "ckpt-000000005.nrc").write_bytes(exabyte_frame(None, iteration=5))
    (ckpts.path / "ckpt-000000006.nrc").write_bytes(exabyte_payload(iteration=6))

    proc = navrl_cli("checkpoints", "verify", "--state-dir", str(state), "--json")
    assert proc.returncode == 65, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    reasons = {Path(d["path"]).name: d["reason"] for d in json.loads(proc.stdout)}
    assert [reasons[f"ckpt-00000000{i}.nrc"] for i in (1, 2, 3)] == [None, None, None]
    assert f"state.learner.policy.{WEIGHT}: non-finite values" in reasons["ckpt-000000004.nrc"]
    assert "LZ4 frame claims 1152921504606846976 bytes" in reasons["ckpt-000000005.nrc"]
    assert "truncated: payload has" in reasons["ckpt-000000006.nrc"]
    assert proc.stderr.count("invalid checkpoint") == 3

    log = run_resumes_past_4_to_6(state)
    assert not any("rolled back" in e["event"].lower() for e in log)
