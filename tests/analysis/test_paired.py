"""Drone-by-drone comparison of two policies (navrl_daemon/analysis/paired.py), checked against
hand-computed values and against its own definitions."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from navrl_daemon.analysis.paired import (
    OUTCOME_CODES,
    binomial_tail,
    clopper_pearson,
    compare,
    compare_outcomes,
    mcnemar_p,
)
from navrl_daemon.rl.evaluate import OUTCOMES


def test_codes_are_the_outcomes_first_letters() -> None:
    assert "".join(name[0].upper() for name in OUTCOMES) == OUTCOME_CODES


def test_mcnemar_by_hand() -> None:
    # 10 drones only A reached, 2 only B: twice P(X <= 2), X ~ Bin(12, 1/2) = 2 * 79 / 4096
    assert mcnemar_p(10, 2) == pytest.approx(2 * (1 + 12 + 66) / 4096)
    assert mcnemar_p(2, 10) == mcnemar_p(10, 2)
    assert mcnemar_p(0, 0) == 1.0
    assert mcnemar_p(3, 3) == 1.0  # the doubled tail is above 1: capped
    assert mcnemar_p(5, 0) == pytest.approx(2 / 32)


def test_clopper_pearson_closed_forms() -> None:
    # k = 0 and k = m have closed forms: 1 - (alpha/2)^(1/m) and (alpha/2)^(1/m)
    lo, hi = clopper_pearson(0, 10)
    assert lo == 0.0 and hi == pytest.approx(1 - 0.025 ** (1 / 10), abs=1e-9)
    lo, hi = clopper_pearson(10, 10)
    assert hi == 1.0 and lo == pytest.approx(0.025 ** (1 / 10), abs=1e-9)
    # inside: each bound puts exactly alpha/2 in its tail
    lo, hi = clopper_pearson(7, 20)
    assert binomial_tail(7, 20, lo, upper=True) == pytest.approx(0.025, abs=1e-9)
    assert binomial_tail(7, 20, hi, upper=False) == pytest.approx(0.025, abs=1e-9)
    assert lo < 7 / 20 < hi


def test_compare_by_hand() -> None:
    a, b = "RRCT", "RCCR"
    out = compare(a, b, "R")
    assert (out["both"], out["only_a"], out["only_b"]) == (1, 1, 1)
    assert out["share_a"] == out["share_b"] == 0.5 and out["difference"] == 0.0
    assert out["p"] == 1.0
    lo, hi = out["ci95"]
    assert lo < 0 < hi
    collided = compare(a, b, "C")
    assert (collided["both"], collided["only_a"], collided["only_b"]) == (1, 0, 1)
    assert collided["difference"] == pytest.approx(-0.25)
    assert set(compare_outcomes(a, b)) == {"reach_goal", "collision"}


def test_identical_outcomes_differ_by_nothing() -> None:
    out = compare("RRCOT" * 50, "RRCOT" * 50)
    assert out["difference"] == 0.0 and out["ci95"] == [0.0, 0.0] and out["p"] == 1.0


def test_four_discordant_drones_are_no_difference() -> None:
    # A's 20 failures are a subset of B's 24: the normal approximation's interval would
    # exclude 0 (0.0156 +- 0.0152); four drones one way are p = 1/8, and the exact
    # interval includes 0.
    a, b = "C" * 20 + "R" * 236, "C" * 24 + "R" * 232
    out = compare(a, b)
    assert out["only_a"] == 4 and out["only_b"] == 0
    assert out["p"] == pytest.approx(0.125)
    lo, hi = out["ci95"]
    assert lo < 0 < hi and hi == pytest.approx(4 / 256)


def test_many_discordant_drones_one_way_are_a_difference() -> None:
    a, b = "C" * 10 + "R" * 246, "C" * 40 + "R" * 216
    out = compare(a, b)
    assert out["p"] < 1e-6
    lo, hi = out["ci95"]
    assert 0 < lo < out["difference"] <= hi  # all one way: the upper end is m / n itself


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="not the same drones"):
        compare("RR", "RRR")
    with pytest.raises(ValueError, match="codes other than"):
        compare("RX", "RR")
    with pytest.raises(ValueError, match="no drones"):
        compare("", "")
    with pytest.raises(ValueError, match="is not one of"):
        compare("RR", "RR", "Z")


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(OUTCOME_CODES), st.sampled_from(OUTCOME_CODES)),
        min_size=1,
        max_size=120,
    )
)
def test_interval_and_test_agree(pairs: list[tuple[str, str]]) -> None:
    """The interval holds the difference, and it excludes 0 exactly when p < 0.05."""
    a = "".join(x for x, _ in pairs)
    b = "".join(y for _, y in pairs)
    for code in OUTCOME_CODES:
        out = compare(a, b, code)
        lo, hi = out["ci95"]
        assert lo - 1e-9 <= out["difference"] <= hi + 1e-9
        assert out["difference"] == pytest.approx(out["share_a"] - out["share_b"])
        if not math.isclose(out["p"], 0.05, abs_tol=1e-6):
            assert (lo > 0 or hi < 0) == (out["p"] < 0.05)
