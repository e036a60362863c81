"""Confidence intervals over windows: calibration against known truth, and low-signal honesty.

Simulation: d = 10, Sigma = diag(0.2..2.0), |G|^2 = 0.25 (B_simple = 44), 4 micro-batches of 8
per step, micro-batch noise AR(1)-correlated from step to step (rho = 0.5), 500 steps per
window. 400 windows with a fixed seed; nominal 90% intervals must cover 85-95% of the time.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import scipy.stats

from noisescope.estimators import (
    NoiseScale,
    interval_from_blocks,
    interval_from_steps,
    reblock,
    student_t_quantile,
)

D, K, B = 10, 4, 8


def _simulate(
    seed: int, reps: int, steps: int, rho: float
) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """Per-step (|𝒢|^2, 𝒮) estimates from accumulation-style samples with known truth."""
    rng = np.random.default_rng(seed)
    sigma_diag = np.linspace(0.2, 2.0, D)
    g = rng.normal(size=D)
    g *= 0.5 / np.linalg.norm(g)
    z = rng.normal(size=(reps, steps, K, D))
    for t in range(1, steps):
        z[:, t] = rho * z[:, t - 1] + math.sqrt(1 - rho**2) * z[:, t]
    micro = g + z * np.sqrt(sigma_diag / B)
    g_small_sq = (micro**2).sum(-1).mean(-1)
    g_big_sq = (micro.mean(2) ** 2).sum(-1)
    b_small, b_big = B, K * B
    g_sq = (b_big * g_big_sq - b_small * g_small_sq) / (b_big - b_small)
    trace_sigma = (g_small_sq - g_big_sq) / (1 / b_small - 1 / b_big)
    truth = {"g_sq": float(g @ g), "trace_sigma": float(sigma_diag.sum())}
    truth["b_simple"] = truth["trace_sigma"] / truth["g_sq"]
    return g_sq, trace_sigma, truth


def _coverage(
    g_sq: np.ndarray, trace_sigma: np.ndarray, truth: dict[str, float], **kw: int
) -> dict[str, float]:
    hits = {"g_sq": 0, "trace_sigma": 0, "b_simple": 0}
    for r in range(g_sq.shape[0]):
        iv = interval_from_steps(g_sq[r].tolist(), trace_sigma[r].tolist(), level=0.9, **kw)
        for name in hits:
            est = getattr(iv, name)
            hits[name] += est is not None and est.lo <= truth[name] <= est.hi
    return {k: v / g_sq.shape[0] for k, v in hits.items()}


def test_nominal_90_percent_intervals_cover_85_to_95_percent() -> None:
    g_sq, trace_sigma, truth = _simulate(seed=0, reps=400, steps=500, rho=0.5)
    cover = _coverage(g_sq, trace_sigma, truth, n_blocks=10)
    for name, c in cover.items():
        assert 0.85 <= c <= 0.95, (name, c)


def test_unequal_sql_buckets_are_calibrated_too() -> None:
    """Bucket rows from SQL have unequal counts; the weighted jackknife handles them."""
    g_sq, trace_sigma, truth = _simulate(seed=1, reps=300, steps=500, rho=0.3)
    rng = np.random.default_rng(7)
    hits = 0
    for r in range(g_sq.shape[0]):
        cuts = np.sort(rng.choice(np.arange(10, 490), size=11, replace=False))
        edges = [0, *cuts.tolist(), 500]
        n = [float(b - a) for a, b in itertools.pairwise(edges)]
        sg = [float(g_sq[r, a:b].sum()) for a, b in itertools.pairwise(edges)]
        ss = [float(trace_sigma[r, a:b].sum()) for a, b in itertools.pairwise(edges)]
        iv = interval_from_blocks(n, sg, ss, level=0.9)
        assert iv.n == 500
        assert iv.n_blocks == 12
        hits += iv.b_simple is not None and iv.b_simple.lo <= truth["b_simple"] <= iv.b_simple.hi
    assert 0.85 <= hits / g_sq.shape[0] <= 0.95


def test_treating_correlated_steps_as_independent_undercovers() -> None:
    """Why blocks: one block per step ignores the correlation and the intervals are too short."""
    g_sq, trace_sigma, truth = _simulate(seed=2, reps=200, steps=400, rho=0.8)
    naive = _coverage(g_sq, trace_sigma, truth, n_blocks=400)
    blocked = _coverage(g_sq, trace_sigma, truth, n_blocks=10)
    assert naive["b_simple"] < 0.75
    assert blocked["b_simple"] >= 0.85


def test_low_signal_window_is_not_measurable_never_negative() -> None:
    """|G|^2 indistinguishable from zero: no B_simple, a reason, intervals clipped at zero."""
    rng = np.random.default_rng(3)
    g_sq = rng.normal(0.0, 1.0, size=200)
    trace_sigma = rng.normal(50.0, 5.0, size=200)
    iv = interval_from_steps(g_sq.tolist(), trace_sigma.tolist())
    assert iv.b_simple is None
    assert not iv.measurable
    assert iv.reason is not None
    assert iv.reason.startswith("not yet measurable")
    assert iv.g_sq is not None
    assert iv.g_sq.lo >= 0.0
    assert iv.trace_sigma is not None
    assert iv.trace_sigma.lo > 0.0


def test_positive_but_insignificant_g_sq_is_not_measurable() -> None:
    """A positive point estimate that is not significantly > 0 must not produce an interval."""
    rng = np.random.default_rng(4)
    g_sq = rng.normal(0.2, 5.0, size=200)
    g_sq += 0.2 - g_sq.mean()
    iv = interval_from_steps(g_sq.tolist(), [10.0] * 200)
    assert NoiseScale.from_sums(float(g_sq.sum()), 2000.0, 200).b_simple is not None
    assert iv.b_simple is None
    assert iv.reason is not None
    assert "significantly" in iv.reason


def test_too_few_blocks_say_so() -> None:
    iv = interval_from_blocks([10.0], [5.0], [50.0])
    assert iv.b_simple is None
    assert iv.reason is not None
    assert "at least 2 blocks" in iv.reason
    assert interval_from_blocks([], [], []).reason is not None


def test_interval_is_finite_and_contains_point() -> None:
    rng = np.random.default_rng(5)
    iv = interval_from_steps(rng.normal(1.0, 0.3, 300).tolist(), rng.normal(30, 3, 300).tolist())
    assert iv.b_simple is not None
    assert 0 <= iv.b_simple.lo <= iv.b_simple.value <= iv.b_simple.hi < math.inf


def test_reblock_keeps_sums_exact_and_contiguous() -> None:
    n, g, s = reblock([1.0] * 103, list(range(103)), [2.0 * i for i in range(103)], n_blocks=10)
    assert len(n) == 10
    assert sum(n) == 103
    assert sum(g) == sum(range(103))
    assert sum(s) == 2 * sum(range(103))
    assert max(n) - min(n) <= 1
    # contiguity: the first block holds the first steps
    assert g[0] == sum(range(int(n[0])))


@pytest.mark.parametrize("df", [1, 2, 5, 9, 29, 200])
@pytest.mark.parametrize("p", [0.95, 0.975, 0.6, 0.05])
def test_student_t_quantile_matches_scipy(df: int, p: float) -> None:
    assert student_t_quantile(p, df) == pytest.approx(scipy.stats.t.ppf(p, df), rel=1e-8)
