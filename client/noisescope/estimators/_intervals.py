"""Confidence intervals for a window's |G|^2, tr(Sigma) and B_simple from contiguous blocks of
steps (docs/science.md, "Two-batch-size unbiased estimator": a window's interval), and the
interval policy of a bucketed series (``bucket_noise_scales``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ._stats import check_level, fieller, fieller_lower_bound, student_t_quantile
from ._two_batch import NoiseScale, _b_simple_rule, b_simple_and_reason

# --- Confidence intervals over windows of steps ---------------------------------------------
#
# Per-step estimates are strongly autocorrelated (the parameters move slowly, and with Adam or
# momentum the batches' effects linger), so treating steps as independent makes intervals far
# too narrow. We group consecutive steps into contiguous blocks, long enough that block means
# are nearly independent, and use the delete-one-block jackknife (Busing et al. 1999 for
# unequal block sizes) for the variances of the window means of |𝒢|^2 and 𝒮 and their
# covariance, Student-t quantiles with (blocks - 1) degrees of freedom, and Fieller's interval
# for their ratio B_simple (exact for a ratio of jointly normal means; unbounded exactly when the
# |G|^2 estimate is not significantly positive, which is our "not yet measurable" test).


@dataclass(frozen=True)
class Interval:
    """A point estimate with a two-sided confidence interval [lo, hi]."""

    value: float
    lo: float
    hi: float


@dataclass(frozen=True)
class NoiseScaleInterval:
    """Window estimates of |G|^2, tr(Sigma), B_simple with ``level`` confidence intervals.

    Any field is None when it cannot be measured yet; ``reason`` then says why (the dashboard
    shows it instead of a number). ``b_simple`` is only given when |G|^2 is significantly
    positive at ``level``, so its interval is always finite and non-negative.
    """

    level: float
    n: float
    n_blocks: int
    g_sq: Interval | None
    trace_sigma: Interval | None
    b_simple: Interval | None
    reason: str | None = None
    #: While ``b_simple`` is None: the ``level`` lower confidence bound on B_simple when 𝒮 is
    #: significantly positive but |𝒢|^2 is not (Fieller's set cut to B_simple >= 0 is then
    #: [bound, inf)); None when nothing is known.
    b_simple_lower: float | None = None

    @property
    def measurable(self) -> bool:
        return self.b_simple is not None

    @classmethod
    def unmeasured(cls, level: float, n: float, n_blocks: int, reason: str) -> NoiseScaleInterval:
        """A window too small for any estimate: no interval, no bound, and why."""
        return cls(level, n, n_blocks, None, None, None, reason)


def reblock(
    block_n: Sequence[float],
    block_sum_g_sq: Sequence[float],
    block_sum_trace_sigma: Sequence[float],
    n_blocks: int = 20,
) -> tuple[list[float], list[float], list[float]]:
    """Merge consecutive blocks (or single steps, n=1 each) into at most ``n_blocks`` blocks.

    Blocks are contiguous and get roughly equal counts, so that block means stay nearly
    independent even when neighbouring steps are correlated. Sums stay exact sums.
    """
    if not len(block_n) == len(block_sum_g_sq) == len(block_sum_trace_sigma):
        raise ValueError("block_n, block_sum_g_sq and block_sum_trace_sigma differ in length")
    if n_blocks < 1:
        raise ValueError(f"n_blocks must be at least 1, got {n_blocks}")
    if len(block_n) <= n_blocks:
        return list(map(float, block_n)), list(block_sum_g_sq), list(block_sum_trace_sigma)
    total = float(sum(block_n))
    if total <= 0:
        return list(map(float, block_n)), list(block_sum_g_sq), list(block_sum_trace_sigma)
    out_n: list[float] = []
    out_g: list[float] = []
    out_s: list[float] = []
    cum = 0.0
    cur_n = cur_g = cur_s = 0.0
    target = 1
    # close a block once the running count reaches its share of the total (the share is
    # worked out once per block: the server reblocks a window for each of thousands of points)
    share = total * target / n_blocks - 1e-9
    for n_b, g_b, s_b in zip(block_n, block_sum_g_sq, block_sum_trace_sigma, strict=True):
        cur_n += n_b
        cur_g += g_b
        cur_s += s_b
        cum += n_b
        if cum >= share and target < n_blocks:
            out_n.append(cur_n)
            out_g.append(cur_g)
            out_s.append(cur_s)
            cur_n = cur_g = cur_s = 0.0
            target += 1
            share = total * target / n_blocks - 1e-9
    if cur_n > 0:
        out_n.append(cur_n)
        out_g.append(cur_g)
        out_s.append(cur_s)
    return out_n, out_g, out_s


#: Blocks an interval is computed from: more are merged into this many (``reblock``): long
#: compared with the step-to-step correlation, and enough for the jackknife's t quantile.
INTERVAL_BLOCKS = 30


@dataclass(frozen=True)
class BlockMoments:
    """A window's means of |𝒢|^2 and 𝒮 and the variances of those means (delete-one-block
    jackknife over ``n_blocks`` contiguous blocks, Busing et al. 1999), for intervals and for
    comparing two windows."""

    n: float
    n_blocks: int
    g_sq: float
    trace_sigma: float
    var_g_sq: float
    var_trace_sigma: float
    cov: float


def block_moments(
    block_n: Sequence[float],
    block_sum_g_sq: Sequence[float],
    block_sum_trace_sigma: Sequence[float],
    max_blocks: int | None = None,
) -> BlockMoments:
    """``BlockMoments`` of contiguous per-block sums, merged first into at most ``max_blocks``
    (default ``INTERVAL_BLOCKS``) blocks; empty and non-finite blocks are left out. Means and
    variances are 0 (and ``n_blocks`` < 2) when there are too few blocks to tell."""
    return BlockMoments(*_moments(block_n, block_sum_g_sq, block_sum_trace_sigma, max_blocks))


def _moments(
    block_n: Sequence[float],
    block_sum_g_sq: Sequence[float],
    block_sum_trace_sigma: Sequence[float],
    max_blocks: int | None,
) -> tuple[float, int, float, float, float, float, float]:
    """``block_moments``'s fields as a tuple: the server computes one per bucket."""
    ns, gs, ss = reblock(
        block_n, block_sum_g_sq, block_sum_trace_sigma, max_blocks or INTERVAL_BLOCKS
    )
    n_sum, g_sum, s_sum = sum(ns), sum(gs), sum(ss)
    if not (ns and min(ns) > 0 and math.isfinite(n_sum + g_sum + s_sum)):
        # leave out empty and non-finite blocks (a finite sum has no non-finite term, so
        # otherwise every block counts)
        rows = [
            (n_b, g_b, s_b)
            for n_b, g_b, s_b in zip(ns, gs, ss, strict=True)
            if n_b > 0 and math.isfinite(g_b) and math.isfinite(s_b)
        ]
        ns, gs, ss = [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]
        n_sum, g_sum, s_sum = sum(ns), sum(gs), sum(ss)
    m = len(ns)
    if m < 2:
        return float(n_sum), m, 0.0, 0.0, 0.0, 0.0, 0.0
    n_total = float(n_sum)
    g_mean = g_sum / n_total
    s_mean = s_sum / n_total
    # Delete-one-block jackknife for a (weighted) mean: var = (1/m) sum n_j/(N-n_j) (x_j - x)^2
    var_g = var_s = cov_gs = 0.0
    for n_b, g_b, s_b in zip(ns, gs, ss, strict=True):
        w = n_b / (n_total - n_b)
        dg = g_b / n_b - g_mean
        ds = s_b / n_b - s_mean
        var_g += w * dg * dg
        var_s += w * ds * ds
        cov_gs += w * dg * ds
    return n_total, m, g_mean, s_mean, var_g / m, var_s / m, cov_gs / m


def b_simple_interval(
    block_n: Sequence[float],
    block_sum_g_sq: Sequence[float],
    block_sum_trace_sigma: Sequence[float],
    level: float = 0.9,
    max_blocks: int | None = None,
) -> tuple[float, float] | None:
    """``interval_from_blocks(...).b_simple``'s ends (lo, hi), or None where it has none: the
    same numbers without the |G|^2 and tr(Sigma) intervals and the objects, for the server's
    interval of each of thousands of buckets per series."""
    check_level(level)
    n_total, m, g_mean, s_mean, var_g, var_s, cov_gs = _moments(
        block_n, block_sum_g_sq, block_sum_trace_sigma, max_blocks
    )
    if m < 2 or _b_simple_rule(g_mean, s_mean, n_total)[0] is None:
        return None
    lo, hi = fieller(s_mean, g_mean, var_s, var_g, cov_gs, level, m - 1)
    return None if lo is None or hi is None else (lo, hi)


def interval_from_blocks(
    block_n: Sequence[float],
    block_sum_g_sq: Sequence[float],
    block_sum_trace_sigma: Sequence[float],
    level: float = 0.9,
    max_blocks: int | None = None,
) -> NoiseScaleInterval:
    """Confidence intervals for a window from contiguous per-block sums.

    Inputs are what SQL computes per bucket of consecutive steps: the count ``n_b`` and the
    sums of the per-sample estimates ``g_sq_est`` and ``trace_sigma_est`` (App. A.1). More than
    ``max_blocks`` blocks are merged first (``reblock``) so that the blocks are long compared with
    the step-to-step correlation. Needs at least 2 non-empty blocks.
    """
    check_level(level)
    mom = block_moments(block_n, block_sum_g_sq, block_sum_trace_sigma, max_blocks)
    n_total, m = mom.n, mom.n_blocks
    if m < 2:
        reason = f"not yet measurable: an interval needs at least 2 blocks of steps, got {m}"
        return NoiseScaleInterval.unmeasured(level, n_total, m, reason)
    g_mean, s_mean = mom.g_sq, mom.trace_sigma
    var_g, var_s, cov_gs = mom.var_g_sq, mom.var_trace_sigma, mom.cov
    t = student_t_quantile(0.5 + level / 2.0, m - 1)
    se_g, se_s = math.sqrt(var_g), math.sqrt(var_s)
    # Both true quantities are >= 0, so clipping the lower ends at 0 never loses coverage.
    g_iv = Interval(g_mean, max(0.0, g_mean - t * se_g), max(0.0, g_mean + t * se_g))
    s_iv = Interval(s_mean, max(0.0, s_mean - t * se_s), max(0.0, s_mean + t * se_s))
    point = NoiseScale.from_means(g_mean, s_mean, n_total)
    if point.b_simple is None:
        bound = fieller_lower_bound(s_mean, g_mean, var_s, var_g, cov_gs, level, m - 1)
        return NoiseScaleInterval(level, n_total, m, g_iv, s_iv, None, point.reason, bound)
    # Fieller: {rho : (s - rho g)^2 <= t^2 (var_s - 2 rho cov + rho^2 var_g)}
    lo, hi = fieller(s_mean, g_mean, var_s, var_g, cov_gs, level, m - 1)
    if lo is None or hi is None:
        return NoiseScaleInterval(
            level,
            n_total,
            m,
            g_iv,
            s_iv,
            None,
            f"not yet measurable: the |G|^2 estimate ({g_mean:.3g}) is not significantly above "
            f"zero at {level:.0%} confidence (gradient signal below the noise; widen the window)",
            fieller_lower_bound(s_mean, g_mean, var_s, var_g, cov_gs, level, m - 1),
        )
    return NoiseScaleInterval(level, n_total, m, g_iv, s_iv, Interval(point.b_simple, lo, hi), None)


def interval_from_steps(
    g_sq: Sequence[float],
    trace_sigma: Sequence[float],
    level: float = 0.9,
    n_blocks: int = 20,
) -> NoiseScaleInterval:
    """``interval_from_blocks`` for a sequence of per-step estimates, in ``n_blocks`` blocks."""
    merged = reblock([1.0] * len(g_sq), g_sq, trace_sigma, n_blocks)
    return interval_from_blocks(*merged, level=level, max_blocks=n_blocks)


# --- A bucketed series: each bucket's B_simple and interval -----------------------------------

#: Smallest bucket of a series that gets its own interval: a handful of samples cut into blocks
#: says nothing useful, and skipping them keeps short runs' 2000-point series cheap.
MIN_INTERVAL_SAMPLES = 32
#: Jackknife blocks per bucket of a series: a bucket is read as this many contiguous
#: sub-buckets, the blocks of its own interval.
BUCKET_BLOCKS = 4


def bucket_blocks(n_samples: float, n_buckets: int) -> int:
    """Sub-buckets to read per bucket for ``n_samples`` in ``n_buckets`` buckets:
    ``BUCKET_BLOCKS`` where a bucket can hold ``MIN_INTERVAL_SAMPLES``, else 1 (the buckets
    then get no interval, so reading them finer would buy nothing)."""
    return BUCKET_BLOCKS if n_samples >= MIN_INTERVAL_SAMPLES * n_buckets else 1


@dataclass(frozen=True)
class BucketNoiseScales:
    """``bucket_noise_scales``: one value per bucket, a column per field."""

    g_sq: list[float]
    trace_sigma: list[float]
    b_simple: list[float | None]
    reason: list[str | None]
    lo: list[float | None]
    hi: list[float | None]


def bucket_noise_scales(
    n: Sequence[float],
    sum_g_sq: Sequence[float],
    sum_trace_sigma: Sequence[float],
    blocks: Sequence[tuple[Sequence[float], Sequence[float], Sequence[float]]] | None,
    level: float = 0.9,
) -> BucketNoiseScales:
    """Each bucket's |G|^2 and tr(Sigma) (means of its sums) and B_simple (eq. 5, ratio of
    sums, ``b_simple_and_reason``), with its ``level`` interval over its ``blocks`` (its
    sub-buckets, or a smoothed window's buckets: ``b_simple_interval``) where it has a B_simple,
    at least ``MIN_INTERVAL_SAMPLES`` samples and 2 blocks; no intervals without ``blocks``.

    Column by column: a series holds thousands of buckets, and per-bucket calls were most of
    a series read's time. Empty buckets get NaN means and no B_simple."""
    rule = list(map(b_simple_and_reason, sum_g_sq, sum_trace_sigma, n))
    b_simple = [r[0] for r in rule]
    lo: list[float | None] = [None] * len(rule)
    hi: list[float | None] = [None] * len(rule)
    if blocks is not None:
        for k, (b, count, bucket) in enumerate(zip(b_simple, n, blocks, strict=True)):
            if b is not None and count >= MIN_INTERVAL_SAMPLES and len(bucket[0]) >= 2:
                bounds = b_simple_interval(*bucket, level=level)
                if bounds is not None:
                    lo[k], hi[k] = bounds
    return BucketNoiseScales(
        g_sq=[g / c if c > 0 else math.nan for g, c in zip(sum_g_sq, n, strict=True)],
        trace_sigma=[s / c if c > 0 else math.nan for s, c in zip(sum_trace_sigma, n, strict=True)],
        b_simple=b_simple,
        reason=[r[1] for r in rule],
        lo=lo,
        hi=hi,
    )
