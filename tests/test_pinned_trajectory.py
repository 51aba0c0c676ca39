"""Per-frame behaviour is pinned: two short CPU runs (config/default.toml and
config/navrl.toml at a tiny size) give the losses, evaluations and final weights recorded
in tests/data/pinned_trajectory.json, to the bit (tests/pinned_trajectory.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.pinned_trajectory import FIXTURE, RUNS, trajectory

PINNED = json.loads(FIXTURE.read_text())
# Statistics reported under another name since the recording: the same numbers.
RENAMED = {"entropy": "entropy_loss"}


@pytest.mark.skipif(
    PINNED["torch"] != torch.__version__,
    reason=f"the trajectory was recorded with torch {PINNED['torch']}, this is "
    f"{torch.__version__}: float results differ between versions (regenerate: "
    "python -m tests.pinned_trajectory)",
)
@pytest.mark.parametrize("name", RUNS)
def test_the_run_computes_what_was_recorded(tmp_path: Path, name: str) -> None:
    pinned, now = PINNED["runs"][name], trajectory(tmp_path / "state", name)
    assert now["policy_sha256"] == pinned["policy_sha256"], "the final weights differ"
    assert len(now["history"]) == len(pinned["history"])
    for was, row in zip(pinned["history"], now["history"], strict=True):
        # A statistic added since the recording is new, not a change.
        same = {k: row.get(RENAMED.get(k, k)) for k in was}
        assert same == was, f"iteration {was['iteration']}"
    # The evaluator's channel coalesces: a busy machine may skip one, never change one.
    recorded = {r["iteration"]: r for r in pinned["eval"]}
    assert now["eval"] and now["eval"][-1]["iteration"] == pinned["eval"][-1]["iteration"]
    for row in now["eval"]:
        was = recorded[row["iteration"]]
        assert {k: row.get(k) for k in was} == was, f"evaluation {row['iteration']}"
