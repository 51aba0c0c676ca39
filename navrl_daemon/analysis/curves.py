"""Learning curves: the first evaluation of a curve at a bar of reach_goal."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def at_bar(row: dict[str, Any], bar: float, *, prefix: str = "") -> bool:
    """Whether `row` has `{prefix}reach_goal` >= bar and `{prefix}collision` <= 1 - bar
    (both bounds inclusive); False where the row lacks them (e.g. no held-out numbers)."""
    reach, collision = row.get(f"{prefix}reach_goal"), row.get(f"{prefix}collision")
    if reach is None or collision is None:
        return False
    # Rounded: 1 - 0.9 is 0.09999999999999998 in floats, and 0.1 must pass.
    return reach >= bar and collision <= round(1.0 - bar, 9)


def first_at_bar(
    curve: Iterable[dict[str, Any]],
    bar: float,
    *,
    prefix: str = "",
    targets: set[int] | None = None,
) -> dict[str, Any] | None:
    """The first row at the bar (`at_bar`), at a curriculum stage of `targets` (None: any
    row); None where no row is. `prefix` "held_out_" reads the held-out maps' numbers."""
    for row in curve:
        if targets is not None and row.get("curriculum_stage") not in targets:
            continue
        if at_bar(row, bar, prefix=prefix):
            return row
    return None
