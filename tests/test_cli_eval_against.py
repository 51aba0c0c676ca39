"""`navrl-daemon eval --against`: two policies flown on the same drones, compared drone by
drone (navrl_daemon/analysis/paired.py), as a user runs it."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from navrl_daemon.storage.policy_file import load_any_policy_state
from tests.conftest import NAVRL_CHECKPOINT, navrl_cli

# NavRL's static task on a small field, cheap enough for the CI machine: 12 drones, 300
# steps, a 16 m field of 60 pillars, no moving obstacles (NavRL's policy flies all 12 to
# the step cap; with its actor nudged 3 of them collide).
COMMON = ["--config", "config/navrl-original.toml", "--episodes", "12", "run.device=cpu"]
COMMON += ["eval.max_steps=300", "env.num_dynamic_obstacles=0", "env.field_size=16.0"]
COMMON += ["env.num_obstacles=60"]


def test_a_policy_against_itself_differs_on_no_drone() -> None:
    proc = navrl_cli(
        "eval",
        "--checkpoint",
        str(NAVRL_CHECKPOINT),
        "--against",
        str(NAVRL_CHECKPOINT),
        "--json",
        *COMMON,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["outcomes"] == out["against"]["outcomes"] and len(out["outcomes"]) == 12
    for number in ("reach_goal", "collision"):
        paired = out["paired"][number]
        assert (paired["difference"], paired["ci95"], paired["p"]) == (0.0, [0.0, 0.0], 1.0)
        assert out[number] == out["against"][number] == paired["share_a"]


def test_another_policy_is_compared_on_the_drones_where_they_differ(tmp_path: Path) -> None:
    """NavRL's policy with its heads nudged flies other outcomes on some drones: the
    comparison counts exactly those, and its shares are the two evaluations' numbers."""
    state = load_any_policy_state(NAVRL_CHECKPOINT)
    g = torch.Generator().manual_seed(0)
    nudged = {
        k: v + 0.5 * torch.randn(v.shape, generator=g)
        if "actor" in k and v.is_floating_point()
        else v
        for k, v in state.items()
    }
    other = tmp_path / "nudged.pt"
    torch.save(nudged, other)
    proc = navrl_cli(
        "eval", "--checkpoint", str(other), "--against", str(NAVRL_CHECKPOINT), "--json", *COMMON
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    mine, theirs = out["outcomes"], out["against"]["outcomes"]
    assert mine != theirs, (mine, theirs)  # a comparison that has something to count
    for number, code in (("reach_goal", "R"), ("collision", "C")):
        paired = out["paired"][number]
        assert paired["only_a"] == sum(x == code != y for x, y in zip(mine, theirs, strict=True))
        assert paired["only_b"] == sum(y == code != x for x, y in zip(mine, theirs, strict=True))
        assert paired["share_a"] == out[number] and paired["share_b"] == out["against"][number]
        lo, hi = paired["ci95"]
        assert lo <= paired["difference"] <= hi and 0.0 <= paired["p"] <= 1.0
    text = navrl_cli(
        "eval", "--checkpoint", str(other), "--against", str(NAVRL_CHECKPOINT), *COMMON
    )
    assert text.returncode == 0, text.stderr[-2000:]
    assert "reach_goal vs:" in text.stdout and "McNemar p" in text.stdout
    assert mine not in text.stdout  # the per-drone string is for --json


def test_against_is_refused_with_drawings_and_a_bad_file_is_bad_data(tmp_path: Path) -> None:
    both = ["eval", "--checkpoint", str(NAVRL_CHECKPOINT), "--against", str(NAVRL_CHECKPOINT)]
    proc = navrl_cli(*both, "--plot", str(tmp_path / "p.png"), *COMMON)
    assert proc.returncode == 2 and "--against compares two plain evaluations" in proc.stderr
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a policy")
    proc = navrl_cli("eval", "--checkpoint", str(NAVRL_CHECKPOINT), "--against", str(bad), *COMMON)
    assert proc.returncode == 65 and "bad.pt" in proc.stderr, proc.stderr[-2000:]
