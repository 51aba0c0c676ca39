"""How far an evaluation's share (reach_goal, collision) of N drones may be from the
policy's own: the interval `report`, `status`, the Prometheus gauges (and so the
regression alert) and benchmarks/learning.py show beside it.
Pure Python, so `status` stays free of torch."""

from __future__ import annotations

# z of a two-sided 95 % interval.
Z95 = 1.959964


def share_interval(share: float, episodes: int, z: float = Z95) -> tuple[float, float] | None:
    """Wilson's score interval (95 % by default) for a share of `episodes` evaluation
    episodes, e.g. reach_goal: how far the share of that many drones may be from the
    policy's own. 64 drones at 0.80 give 0.69-0.88, 256 give 0.75-0.84. None without
    episodes. Wilson's rather than the normal approximation: it stays inside 0..1 and is
    not zero wide at a share of 0 or 1."""
    if episodes <= 0:
        return None
    n = float(episodes)
    centre = (share + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * (share * (1 - share) / n + z * z / (4 * n * n)) ** 0.5
    return max(0.0, centre - half), min(1.0, centre + half)


def drones_for(share: float, half_width: float, z: float = Z95) -> int:
    """The fewest drones whose `share_interval` at `share` is at most ±`half_width` wide
    (e.g. 0.625 and ±0.05: 357): how many an evaluation needs to tell policies that far
    apart from each other."""

    def wide(n: int) -> bool:
        lo, hi = share_interval(share, n, z) or (0.0, 1.0)
        return hi - lo > 2 * half_width

    lo, hi = 1, 1
    while wide(hi):  # the width falls as drones are added: double, then bisect
        lo, hi = hi + 1, hi * 2
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if wide(mid) else (lo, mid)
    return hi


def interval_of(share: object, episodes: object) -> tuple[float, float] | None:
    """`share_interval` of a recorded share and episode count (an evaluation's row or
    result); None unless both are numbers (an older row without its episode count)."""
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (share, episodes))
    return share_interval(float(share), int(episodes)) if numbers else None  # type: ignore[arg-type]


def interval_text(share: object, episodes: object) -> str:
    """ " (95 %: LO–HI)" for a share of `episodes` drones; "" without `interval_of`."""
    interval = interval_of(share, episodes)
    return "" if interval is None else f" (95 %: {interval[0]:.2f}–{interval[1]:.2f})"
