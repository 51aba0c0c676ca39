"""Crafted policy files and checkpoints through the commands that read a policy (`eval
--checkpoint`, `checkpoints import`, `checkpoints export --checkpoint`): every one is
refused with exit 65 and its reason, never a traceback, and no payload runs. bfloat16
and float64 policies are read as float32."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from navrl_daemon.storage.checkpoint import encode_checkpoint, load_checkpoint
from navrl_daemon.testing.crafted_files import (
    Crafted,
    accepted_policy_files,
    checkpoint_files,
    policy_files,
    valid_checkpoint,
)
from tests.conftest import NAVRL_CHECKPOINT, navrl_cli

VALID = torch.load(NAVRL_CHECKPOINT, weights_only=True, map_location="cpu")


@pytest.fixture(scope="module")
def crafted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("crafted")
    marker = root / "MARKER"
    return {
        "marker": marker,
        "policies": policy_files(VALID, root / "pt", marker),
        "checkpoints": checkpoint_files(VALID, root / "nrc", marker),
    }


def not_refused(case: Crafted, *command: str) -> str | None:
    """None when `command` exits 65 with `case`'s reason and file named, no traceback and
    no advice to load with weights_only=False; else what it did."""
    proc = navrl_cli(*command)
    err = proc.stderr
    if (
        proc.returncode == 65
        and "Traceback" not in err
        and case.reason in err
        and str(case.path) in err
        and "weights_only=False" not in err
        and "weights_only` set to" not in err
    ):
        return None
    return f"{case.path.name}: exit {proc.returncode}: {err[-600:]}"


def test_eval_refuses_every_crafted_policy_file(crafted, tmp_path: Path) -> None:
    failed = [
        not_refused(case, "eval", "--checkpoint", str(case.path), "--state-dir", str(tmp_path))
        for case in crafted["policies"].values()
    ]
    assert [f for f in failed if f] == []
    assert not crafted["marker"].exists()


def test_eval_refuses_every_crafted_checkpoint(crafted, tmp_path: Path) -> None:
    failed = [
        not_refused(case, "eval", "--checkpoint", str(case.path), "--state-dir", str(tmp_path))
        for case in crafted["checkpoints"].values()
    ]
    assert [f for f in failed if f] == []
    assert not crafted["marker"].exists()


def test_export_of_a_crafted_checkpoint_is_refused(crafted, tmp_path: Path) -> None:
    out = tmp_path / "out.pt"
    args = ["--state-dir", str(tmp_path), "--out", str(out)]
    failed = [
        not_refused(case, "checkpoints", "export", *args, "--checkpoint", str(case.path))
        for case in crafted["checkpoints"].values()
    ]
    assert [f for f in failed if f] == []
    assert not out.exists() and not crafted["marker"].exists()


def test_import_refuses_crafted_files_and_leaves_no_checkpoint(crafted, tmp_path: Path) -> None:
    cases = {**crafted["policies"], **crafted["checkpoints"]}
    failed = [
        not_refused(case, "checkpoints", "import", "--state-dir", str(tmp_path / n), str(case.path))
        for n, case in cases.items()
    ]
    assert [f for f in failed if f] == []
    assert not list(tmp_path.glob("*/checkpoints/*.nrc"))
    assert not crafted["marker"].exists()


def test_import_reads_a_checkpoint_and_wider_or_narrower_floats_as_float32(
    tmp_path: Path,
) -> None:
    sources = {
        "nrc": valid_checkpoint(VALID, tmp_path / "valid.nrc"),
        **accepted_policy_files(VALID, tmp_path / "accepted"),
    }
    for name, source in sources.items():
        state = tmp_path / f"state-{name}"
        proc = navrl_cli("checkpoints", "import", "--state-dir", str(state), str(source))
        assert proc.returncode == 0, proc.stderr[-3000:]
        _, imported = load_checkpoint(state / "checkpoints" / "ckpt-000000000.nrc")
        policy = imported["learner"]["policy"]
        assert {v.dtype for v in policy.values()} == {torch.float32}, name
        for key, value in VALID.items():
            exact = name in ("nrc", "float64")  # float32 -> float64 -> float32 is exact
            tolerance = 0 if exact else 1e-2 * (1 + value.abs().max().item())
            assert (policy[key] - value).abs().max().item() <= tolerance, (name, key)


def test_verify_and_run_take_no_checkpoint_whose_policy_is_not_one(tmp_path: Path) -> None:
    """The check `run` makes before resuming (pipeline/resume.py `CheckpointFit`): a policy
    of complex numbers is refused, where loading it would drop the imaginary parts."""
    complex_policy = {k: v.to(torch.complex64) for k, v in VALID.items()}
    path = tmp_path / "checkpoints" / "ckpt-000000001.nrc"
    path.parent.mkdir()
    state = {"kind": "warm_start", "learner": {"policy": complex_policy}}
    path.write_bytes(encode_checkpoint(state, iteration=1, frames=0, policy_version=0))
    proc = navrl_cli("checkpoints", "verify", "--state-dir", str(tmp_path))
    assert proc.returncode == 65, proc.stderr[-3000:]
    assert "learner.policy: " in proc.stderr and "dtype torch.complex64" in proc.stderr
