"""Learning curves: the first evaluation of a curve at a bar of reach_goal."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def first_at_bar(
    curve: Iterable[dict[str, Any]],
    bar: float,
    *,
    prefix: str = "",
    targets: set[int] | None = None,
) -> dict[str, Any] | None:
    """The first row with `{prefix}reach_goal` >= bar and `{prefix}collision` <= 1 - bar
    (both bounds inclusive), at a curriculum stage of `targets` (None: any row); None
    where no row is. `prefix` "held_out_" reads the held-out maps' numbers."""
    reach, collision = f"{prefix}reach_goal", f"{prefix}collision"
    for row in curve:
        if targets is not None and row.get("curriculum_stage") not in targets:
            continue
        # Rounded: 1 - 0.9 is 0.09999999999999998 in floats, and 0.1 must pass.
        at_bar = row.get(reach) is not None and row[reach] >= bar
        if at_bar and row[collision] <= round(1.0 - bar, 9):
            return row
    return None
