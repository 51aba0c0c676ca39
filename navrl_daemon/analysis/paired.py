"""Two policies flown on the same evaluation drones, compared drone by drone.

NavRL's evaluation is deterministic: the same env config, map seed and evaluation seed
give every policy the same drones (starts, goals, maps). Two policies' results on it are
then paired, and the difference of their shares is measured by the drones on which they
disagree: where both fail the same hard crossings, those drones add nothing to the
difference's noise, so its interval can be much narrower than two independent binomial
intervals would suggest.

An evaluation's outcomes are one character per drone (`OUTCOME_CODES`, in `OUTCOMES`
order: reached, collided, out of bounds, timed out), as `evaluate.outcome_codes` writes
them. `compare` gives, for one outcome, both shares, their difference with an exact 95 %
interval and the exact two-sided McNemar p-value, both from the discordant drones (those
where only one policy had the outcome). The interval is the conditional one: given m
discordant drones, the first policy's count among them is binomial (m, θ) and the
difference is (m/n)(2θ − 1), so Clopper–Pearson's interval for θ maps onto it. It
excludes 0 exactly when p < 0.05 (the two invert the same tails), and unlike the
normal approximation it does not call 4 discordant drones out of 256 a difference.
"""

from __future__ import annotations

import math
from typing import Any

# reached, collided, out of bounds, timed out: the first letters of rl.evaluate.OUTCOMES
OUTCOME_CODES = "RCOT"


def mcnemar_p(only_a: int, only_b: int) -> float:
    """Exact two-sided McNemar p-value: under "no difference" each of the n discordant
    drones is the first policy's with probability 1/2; the p-value is twice the smaller
    binomial tail, at most 1."""
    n = only_a + only_b
    if n == 0:
        return 1.0
    k = min(only_a, only_b)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2.0 * tail)


def binomial_tail(k: int, m: int, theta: float, *, upper: bool) -> float:
    """P(X >= k) (`upper`) or P(X <= k) for X ~ Binomial(m, theta)."""
    ks = range(k, m + 1) if upper else range(k + 1)
    return sum(math.comb(m, i) * theta**i * (1 - theta) ** (m - i) for i in ks)


def clopper_pearson(k: int, m: int, alpha: float = 0.05) -> tuple[float, float]:
    """Exact (Clopper–Pearson) interval for a binomial share from k of m, by bisection
    on the binomial tails (each tail alpha/2)."""
    if m <= 0:
        return 0.0, 1.0

    def solve(upper: bool) -> float:  # the theta where the tail equals alpha/2
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            tail = binomial_tail(k, m, mid, upper=upper)
            # P(X >= k) rises with theta, P(X <= k) falls
            if (tail < alpha / 2) == upper:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    return (0.0 if k == 0 else solve(True)), (1.0 if k == m else solve(False))


def compare(a: str, b: str, outcome: str = "R") -> dict[str, Any]:
    """Policy A against policy B on the same drones, for one outcome code ("R": reached).

    `difference` is A's share minus B's; `ci95` its exact conditional 95 % interval (module
    docstring; with no discordant drone it is [0, 0]); `only_a` and
    `only_b` the drones where only A, or only B, had the outcome; `p` McNemar's exact
    p-value for "the two shares are equal"."""
    if len(a) != len(b):
        raise ValueError(f"not the same drones: {len(a)} outcomes against {len(b)}")
    if not a:
        raise ValueError("no drones to compare")
    codes = set(OUTCOME_CODES)
    for name, s in (("A", a), ("B", b)):
        if not set(s) <= codes:
            raise ValueError(f"{name}'s outcomes hold codes other than {OUTCOME_CODES}")
    if outcome not in codes:
        raise ValueError(f"outcome {outcome!r} is not one of {OUTCOME_CODES}")
    n = len(a)
    hit_a = [c == outcome for c in a]
    hit_b = [c == outcome for c in b]
    only_a = sum(x and not y for x, y in zip(hit_a, hit_b, strict=True))
    only_b = sum(y and not x for x, y in zip(hit_a, hit_b, strict=True))
    m = only_a + only_b
    difference = (only_a - only_b) / n
    theta_lo, theta_hi = clopper_pearson(only_a, m)
    return {
        "drones": n,
        "share_a": sum(hit_a) / n,
        "share_b": sum(hit_b) / n,
        "difference": difference,
        "ci95": [m / n * (2 * theta_lo - 1), m / n * (2 * theta_hi - 1)] if m else [0.0, 0.0],
        "both": sum(x and y for x, y in zip(hit_a, hit_b, strict=True)),
        "only_a": only_a,
        "only_b": only_b,
        "p": mcnemar_p(only_a, only_b),
    }


def compare_outcomes(a: str, b: str) -> dict[str, dict[str, Any]]:
    """`compare` for reaching the goal and for collisions (the goal's two numbers)."""
    return {"reach_goal": compare(a, b, "R"), "collision": compare(a, b, "C")}
