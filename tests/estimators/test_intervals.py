"""Confidence intervals over windows: calibration against known truth, and low-signal honesty.

Simulation: d = 10, Sigma = diag(0.2..2.0), |G|^2 = 0.25 (B_simple = 44), 4 micro-batches of 8
per step, micro-batch noise AR(1)-correlated from step to step (rho = 0.5), 500 steps per
window. 400 windows with a fixed seed; nominal 90% intervals must cover 85-95% of the time.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st

from noisescope.estimators import (
    BlockMoments,
    NoiseScale,
    b_simple_and_reason,
    b_simple_interval,
    block_moments,
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


# --- the server's per-bucket shortcuts give the very same numbers ---------------------------

#: Block sums as stored: mostly ordinary, sometimes zero, negative, huge or not finite.
_SUMS = st.floats(min_value=-50.0, max_value=200.0) | st.sampled_from(
    [0.0, -0.0, 1e-300, 1e200, -1e200, math.inf, -math.inf, math.nan]
)
_COUNTS = st.integers(min_value=1, max_value=300) | st.sampled_from([0, 1, 2**40])


@st.composite
def _blocks(draw: st.DrawFn) -> tuple[list[float], list[float], list[float]]:
    size = draw(st.integers(min_value=0, max_value=45))
    n = [float(draw(_COUNTS)) for _ in range(size)]
    # |G|^2 sums near n (signal) or near 0 (noise), tr(Sigma) sums well above them
    g = [draw(_SUMS) * (draw(st.sampled_from([1.0, 0.01]))) for _ in range(size)]
    return n, g, [draw(_SUMS) for _ in range(size)]


def _reference_reblock(
    block_n: Sequence[float], block_g: Sequence[float], block_s: Sequence[float], n_blocks: int
) -> tuple[list[float], list[float], list[float]]:
    """Merging written out the plain way: close a block once the running count reaches its
    share of the total."""
    total = float(sum(block_n))
    if len(block_n) <= n_blocks or total <= 0:
        return [float(x) for x in block_n], list(block_g), list(block_s)
    out: tuple[list[float], list[float], list[float]] = ([], [], [])
    cum = cur_n = cur_g = cur_s = 0.0
    target = 1
    for n_b, g_b, s_b in zip(block_n, block_g, block_s, strict=True):
        cur_n, cur_g, cur_s, cum = cur_n + n_b, cur_g + g_b, cur_s + s_b, cum + n_b
        if cum >= total * target / n_blocks - 1e-9 and target < n_blocks:
            for column, value in zip(out, (cur_n, cur_g, cur_s), strict=True):
                column.append(value)
            cur_n = cur_g = cur_s = 0.0
            target += 1
    if cur_n > 0:
        for column, value in zip(out, (cur_n, cur_g, cur_s), strict=True):
            column.append(value)
    return out


@settings(max_examples=300, deadline=None)
@given(
    blocks=_blocks(),
    fractions=st.booleans(),
    n_blocks=st.sampled_from([1, 2, 7, 30]),
)
def test_reblock_is_the_plain_merge_bit_for_bit(
    blocks: tuple[list[float], list[float], list[float]], fractions: bool, n_blocks: int
) -> None:
    n, g, s = blocks
    if fractions:
        n = [x / 3.0 for x in n]
    assert _same(reblock(n, g, s, n_blocks), _reference_reblock(n, g, s, n_blocks))


def _reference_moments(
    block_n: Sequence[float],
    block_g: Sequence[float],
    block_s: Sequence[float],
    max_blocks: int | None = None,
) -> BlockMoments:
    """The jackknife written out the plain way: filter the blocks, then mean and variances."""
    merged = _reference_reblock(block_n, block_g, block_s, max_blocks or 30)
    rows = [
        (n_b, g_b, s_b)
        for n_b, g_b, s_b in zip(*merged, strict=True)
        if n_b > 0 and math.isfinite(g_b) and math.isfinite(s_b)
    ]
    n_total = float(sum(r[0] for r in rows))
    m = len(rows)
    if m < 2:
        return BlockMoments(n_total, m, 0.0, 0.0, 0.0, 0.0, 0.0)
    g_mean = sum(r[1] for r in rows) / n_total
    s_mean = sum(r[2] for r in rows) / n_total
    var_g = var_s = cov = 0.0
    for n_b, g_b, s_b in rows:
        w = n_b / (n_total - n_b)
        dg, ds = g_b / n_b - g_mean, s_b / n_b - s_mean
        var_g += w * dg * dg
        var_s += w * ds * ds
        cov += w * dg * ds
    return BlockMoments(n_total, m, g_mean, s_mean, var_g / m, var_s / m, cov / m)


def _same(a: object, b: object) -> bool:
    """Equal, NaN included (repr tells every float apart, signed zeros too)."""
    return repr(a) == repr(b)


@settings(max_examples=400, deadline=None)
@given(blocks=_blocks(), max_blocks=st.sampled_from([None, 2, 7]))
def test_block_moments_are_the_plain_jackknife_bit_for_bit(
    blocks: tuple[list[float], list[float], list[float]], max_blocks: int | None
) -> None:
    assert _same(block_moments(*blocks, max_blocks), _reference_moments(*blocks, max_blocks))


@settings(max_examples=400, deadline=None)
@given(
    blocks=_blocks(),
    level=st.sampled_from([0.5, 0.9, 0.99]),
    max_blocks=st.sampled_from([None, 3]),
)
def test_b_simple_interval_is_interval_from_blocks_b_simple_bit_for_bit(
    blocks: tuple[list[float], list[float], list[float]], level: float, max_blocks: int | None
) -> None:
    """The server's per-bucket interval is ``interval_from_blocks``'s, without the objects."""
    iv = interval_from_blocks(*blocks, level=level, max_blocks=max_blocks).b_simple
    expected = None if iv is None else (iv.lo, iv.hi)
    assert _same(b_simple_interval(*blocks, level=level, max_blocks=max_blocks), expected)


@settings(max_examples=300, deadline=None)
@given(g=_SUMS, s=_SUMS, n=_COUNTS | st.sampled_from([-1]))
def test_b_simple_and_reason_is_noise_scale_from_sums(g: float, s: float, n: int) -> None:
    point = NoiseScale.from_sums(g, s, n)
    assert _same(b_simple_and_reason(g, s, n), (point.b_simple, point.reason))


def test_b_simple_interval_checks_its_level() -> None:
    with pytest.raises(ValueError, match="level"):
        b_simple_interval([1.0, 1.0], [1.0, 1.0], [2.0, 2.0], level=1.0)


@pytest.mark.parametrize("level", [0.0, 1.0, -0.5, 1.5, math.nan])
def test_every_interval_refuses_a_level_outside_0_1_with_one_message(level: float) -> None:
    from noisescope.estimators import fit_critical_batch, local_critical_batch
    from noisescope.forecast import fit_critical_batch_law
    from noisescope.recommend import NoiseTracker

    said = f"level must be in (0, 1), got {level}"
    calls: list[Callable[[], object]] = [
        lambda: interval_from_blocks([8, 8], [1.0, 1.0], [2.0, 2.0], level=level),
        lambda: b_simple_interval([8, 8], [1.0, 1.0], [2.0, 2.0], level=level),
        lambda: fit_critical_batch([8, 16, 32], [100, 60, 40], level=level),
        lambda: local_critical_batch([1, 2], [[1.0], [1.1]], level=level),
        lambda: fit_critical_batch_law([1.0, 0.5, 0.25], [10.0, 20.0, 40.0], level=level),
        lambda: NoiseTracker(level=level),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="level must be") as refused:
            call()
        assert str(refused.value) == said
