"""The two-batch estimator against the closed-form least-squares truth (docs/science.md).

Non-isotropic S (random rotation, eigenvalues 0.3..2.5), sigma = 0.5, d = 6. Each step draws
32 examples; G_small is the mean gradient of the first 4, G_big of all 32. Over 20,000 steps
(fixed seed) |G|^2, tr(Sigma) and B_simple must be within 5% of the closed form, and inside
their 90% intervals. The wrong formulas docs/science.md warns about must miss by far more.
"""

from __future__ import annotations

import numpy as np
import pytest

from noisescope.estimators import (
    NoiseScale,
    interval_from_steps,
    two_batch_estimate_columns,
    two_batch_estimates,
    two_batch_sizes_ok,
)
from tests.estimators.lsq_truth import LeastSquares

STEPS, B_SMALL, B_BIG, TOL = 20_000, 4, 32, 0.05


@pytest.fixture(scope="module")
def measured() -> dict[str, object]:
    problem = LeastSquares.make(d=6, sigma=0.5, seed=0)
    w = problem.w_star + 0.6 * np.random.default_rng(1).normal(size=problem.d)
    x, y = problem.sample(np.random.default_rng(2), (STEPS, B_BIG))
    g = problem.per_example_grads(w, x, y)
    g_small = g[:, :B_SMALL].mean(1)
    g_big = g.mean(1)
    return {
        "truth": problem.truth(w),
        "g_small_sq": (g_small**2).sum(-1),
        "g_big_sq": (g_big**2).sum(-1),
        "g_diff_sq": ((g_big - g_small) ** 2).sum(-1),
    }


def _within(estimate: float, truth: float, tol: float = TOL) -> bool:
    return abs(estimate / truth - 1.0) <= tol


def _per_step(m: dict[str, object]) -> tuple[list[float], list[float]]:
    pairs = [
        two_batch_estimates(B_SMALL, B_BIG, float(a), float(b))
        for a, b in zip(m["g_small_sq"], m["g_big_sq"], strict=True)  # type: ignore[call-overload]
    ]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def test_window_sums_match_closed_form(measured: dict[str, object]) -> None:
    truth: dict[str, float] = measured["truth"]  # type: ignore[assignment]
    g_sq, trace_sigma = _per_step(measured)
    ns = NoiseScale.from_sums(sum(g_sq), sum(trace_sigma), len(g_sq))
    assert ns.b_simple is not None
    assert _within(ns.g_sq, truth["g_sq"])
    assert _within(ns.trace_sigma, truth["trace_sigma"])
    assert _within(ns.b_simple, truth["b_simple"])


def test_intervals_cover_closed_form(measured: dict[str, object]) -> None:
    truth: dict[str, float] = measured["truth"]  # type: ignore[assignment]
    iv = interval_from_steps(*_per_step(measured), level=0.9)
    assert iv.g_sq is not None
    assert iv.trace_sigma is not None
    assert iv.b_simple is not None
    assert iv.g_sq.lo <= truth["g_sq"] <= iv.g_sq.hi
    assert iv.trace_sigma.lo <= truth["trace_sigma"] <= iv.trace_sigma.hi
    assert iv.b_simple.lo <= truth["b_simple"] <= iv.b_simple.hi
    # and the interval is informative, not vacuous
    assert iv.b_simple.hi - iv.b_simple.lo < 0.1 * truth["b_simple"]


def test_mean_of_per_step_ratios_fails_the_check(measured: dict[str, object]) -> None:
    """Per-step ratios averaged are biased and unstable (docs/science.md eq. 5): caught."""
    truth: dict[str, float] = measured["truth"]  # type: ignore[assignment]
    g_sq, trace_sigma = _per_step(measured)
    wrong = float(np.mean(np.array(trace_sigma) / np.array(g_sq)))
    assert not _within(wrong, truth["b_simple"])


def test_misread_formula_fails_the_check(measured: dict[str, object]) -> None:
    """The misreading B = E|G_small|^2 / E|G_big - G_small|^2 must not pass."""
    truth: dict[str, float] = measured["truth"]  # type: ignore[assignment]
    wrong = float(np.mean(measured["g_small_sq"]) / np.mean(measured["g_diff_sq"]))  # type: ignore[call-overload]
    assert not _within(wrong, truth["b_simple"])


def test_single_step_estimates_can_be_negative_but_windows_say_so() -> None:
    """A lone step may give |𝒢|^2 < 0; the window then reports a reason, not a number."""
    g_sq, trace_sigma = two_batch_estimates(1, 2, 10.0, 1.0)
    assert g_sq < 0
    ns = NoiseScale.from_sums(g_sq, trace_sigma, 1)
    assert ns.b_simple is None
    assert ns.reason is not None
    assert ns.reason.startswith("not yet measurable")


@pytest.mark.parametrize(("b_small", "b_big"), [(4, 32), (4.0, 32.0), (0.5, 3.0), (1, 2)])
def test_column_form_gives_the_same_floats_as_the_scalar_one(
    measured: dict[str, object], b_small: float, b_big: float
) -> None:
    """The bulk form the server ingests with must not drift from the definition by one ulp."""
    g_small_sq = [float(v) for v in measured["g_small_sq"]]  # type: ignore[attr-defined]
    g_big_sq = [float(v) for v in measured["g_big_sq"]]  # type: ignore[attr-defined]
    g_small_sq[:3] = [0.0, 5, 1e300]  # zero, an int, a huge norm
    g_sq, trace_sigma = two_batch_estimate_columns(b_small, b_big, g_small_sq, g_big_sq)
    expected = [
        two_batch_estimates(b_small, b_big, s, b) for s, b in zip(g_small_sq, g_big_sq, strict=True)
    ]
    assert g_sq == [e[0] for e in expected]
    assert trace_sigma == [e[1] for e in expected]


def test_column_form_rejects_what_the_scalar_one_rejects() -> None:
    with pytest.raises(ValueError, match="must differ"):
        two_batch_estimate_columns(8.0, 8.0, [1.0], [1.0])
    with pytest.raises(ValueError, match="0 < b_small < b_big"):
        two_batch_estimate_columns(0.0, 8.0, [1.0], [1.0])
    with pytest.raises(ValueError, match="values"):
        two_batch_estimate_columns(1.0, 8.0, [1.0, 2.0], [1.0])
    assert two_batch_estimate_columns(1.0, 8.0, [], []) == ([], [])


@pytest.mark.parametrize(
    ("b_small", "b_big", "ok"),
    [(1, 2, True), (0.5, 0.75, True), (0, 8, False), (-4, 8, False), (8, 8, False), (9, 8, False)],
)
def test_the_batch_size_rule_is_the_one_the_estimators_apply(
    b_small: float, b_big: float, ok: bool
) -> None:
    """``two_batch_sizes_ok`` (which the server's validation calls) accepts exactly the pairs
    that ``two_batch_estimates`` accepts."""
    assert two_batch_sizes_ok(b_small, b_big) is ok
    if ok:
        two_batch_estimates(b_small, b_big, 2.0, 1.0)
    else:
        with pytest.raises(ValueError, match="0 < b_small < b_big"):
            two_batch_estimates(b_small, b_big, 2.0, 1.0)
