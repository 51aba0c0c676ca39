"""`navrl-daemon eval` says how far its shares may be from the policy's own: each with its
95 % interval, and, when the reach rate's is wide, how many drones would tell policies
apart. Outcomes have one name each: `timed_out` is the share the outcome counts call
timed out (NavRL's `truncated` also counts the drones that reached their goal)."""

from __future__ import annotations

import json
import re

from navrl_daemon.ops.intervals import drones_for, share_interval
from tests.conftest import NAVRL_CHECKPOINT, TINY, navrl_cli

EVAL = ["eval", "--checkpoint", str(NAVRL_CHECKPOINT), "--episodes", "8", *TINY]


def test_eight_drones_print_their_interval_and_how_many_would_do() -> None:
    text = navrl_cli(*EVAL)
    assert text.returncode == 0, text.stderr[-2000:]
    fields = dict(line.strip().split(": ", 1) for line in text.stdout.splitlines())
    doc = json.loads(navrl_cli(*EVAL, "--json").stdout)
    lo, hi = share_interval(doc["reach_goal"], 8)
    assert doc["reach_goal_ci95"] == [round(lo, 4), round(hi, 4)]
    assert fields["reach_goal"] == f"{doc['reach_goal']:.4f} (95 %: {lo:.2f}–{hi:.2f})"
    # 8 drones: ±0.2 or wider at any share; the note names the option that fixes it.
    drones = int(re.search(r"--episodes (\d+)$", fields["note"]).group(1))  # type: ignore[union-attr]
    assert drones == drones_for(min(max(0.5, lo), hi), 0.05) and drones >= 300
    assert "8 drones measure reach_goal only to about ±" in fields["note"]
    # One name for drones that timed out, and the same number as the outcome counts.
    assert "truncated" not in fields
    assert doc["timed_out"] == doc["outcomes"]["timed out"] / 8
    assert fields["timed_out"].startswith(f"{doc['timed_out']:.4f} (95 %: ")


def test_drones_for_is_the_fewest_whose_interval_is_that_narrow() -> None:
    for share in (0.0, 0.3, 0.5, 0.625, 0.91, 1.0):
        n = drones_for(share, 0.05)
        lo, hi = share_interval(share, n)  # type: ignore[misc]
        before_lo, before_hi = share_interval(share, n - 1)  # type: ignore[misc]
        assert hi - lo <= 0.1 < before_hi - before_lo, (share, n)
    assert drones_for(0.5, 0.05) == 381  # z²·¼/0.05² ≈ 384, Wilson's a little fewer
