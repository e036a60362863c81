"""The gradient-noise-scale estimators: the one place where noisescope's maths lives.

Equation numbers refer to ``docs/science.md`` (McCandlish et al. 2018, "An Empirical Model
of Large-Batch Training", Appendix A.1 and Sections 2.2-3). Pure Python on purpose: the client
must import it in any training job without numpy, and the server and dashboard call the same
functions on sums computed in SQL.

Why sums: both unbiased estimators are linear in the measured squared norms, so a window's
estimate is the ratio of the *summed* numerator and denominator (never the mean of per-step
ratios, which is biased and unstable).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = [
    "CURRENT_FRACTION",
    "CURRENT_MAX_REL_WIDTH",
    "CURRENT_MIN_SAMPLES",
    "EMA",
    "INTERVAL_BLOCKS",
    "CriticalBatchFit",
    "Interval",
    "NoiseScale",
    "NoiseScaleInterval",
    "b_noise_from_sums",
    "b_simple_from_sums",
    "current_noise_scale",
    "current_window",
    "examples_ratio",
    "fit_critical_batch",
    "interval_from_blocks",
    "interval_from_steps",
    "reblock",
    "steps_ratio",
    "student_t_quantile",
    "two_batch_estimate_columns",
    "two_batch_estimates",
    "two_batch_sizes_ok",
]


def two_batch_estimates(
    b_small: float, b_big: float, g_small_sq: float, g_big_sq: float
) -> tuple[float, float]:
    """Unbiased |G|^2 and tr(Sigma) from one step's squared norms at two batch sizes.

    Solves E|G_B|^2 = |G|^2 + tr(Sigma)/B  (eq. 1) at B_small and B_big (App. A.1)::

        |𝒢|^2 = (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
        𝒮     = (|G_small|^2 - |G_big|^2) / (1/B_small - 1/B_big)

    Either may be negative for a single step; only window averages are meaningful.
    """
    d_g_sq, d_trace_sigma = _two_batch_denominators(b_small, b_big)
    g_sq = (b_big * g_big_sq - b_small * g_small_sq) / d_g_sq
    trace_sigma = (g_small_sq - g_big_sq) / d_trace_sigma
    return g_sq, trace_sigma


def two_batch_sizes_ok(b_small: float, b_big: float) -> bool:
    """Whether the two-batch estimator applies: 0 < B_small < B_big (App. A.1 solves eq. 1 at
    two different batch sizes)."""
    return b_big > b_small > 0


def _two_batch_denominators(b_small: float, b_big: float) -> tuple[float, float]:
    """B_big - B_small and 1/B_small - 1/B_big, after checking 0 < B_small < B_big."""
    if not two_batch_sizes_ok(b_small, b_big):
        raise ValueError(
            f"need 0 < b_small < b_big, got b_small={b_small}, b_big={b_big}: "
            "the two batch sizes must differ (one process and no accumulation has only one)"
        )
    return b_big - b_small, 1.0 / b_small - 1.0 / b_big


def two_batch_estimate_columns(
    b_small: float, b_big: float, g_small_sq: Sequence[float], g_big_sq: Sequence[float]
) -> tuple[list[float], list[float]]:
    """``two_batch_estimates`` for many steps measured at one pair of batch sizes: the
    |𝒢|^2 column and the 𝒮 column.

    Element for element the same expressions as ``two_batch_estimates`` (so the same floats),
    with the denominators computed once and no per-step tuple: about half the cost of mapping
    the scalar function, which matters on the server's bulk ingest path.
    """
    if len(g_small_sq) != len(g_big_sq):
        raise ValueError(
            f"g_small_sq has {len(g_small_sq)} values but g_big_sq has {len(g_big_sq)}"
        )
    d_g_sq, d_trace_sigma = _two_batch_denominators(b_small, b_big)
    g_sq = [
        (b_big * g_b - b_small * g_s) / d_g_sq
        for g_s, g_b in zip(g_small_sq, g_big_sq, strict=True)
    ]
    trace_sigma = [
        (g_s - g_b) / d_trace_sigma for g_s, g_b in zip(g_small_sq, g_big_sq, strict=True)
    ]
    return g_sq, trace_sigma


@dataclass(frozen=True)
class NoiseScale:
    """A window's estimate of |G|^2, tr(Sigma) and B_simple = tr(Sigma)/|G|^2.

    ``b_simple`` is None when it cannot be measured yet; ``reason`` then says why, so callers
    show "not yet measurable" instead of a negative or infinite number.
    """

    g_sq: float
    trace_sigma: float
    n: float
    b_simple: float | None
    reason: str | None = None

    @classmethod
    def from_means(cls, g_sq: float, trace_sigma: float, n: float) -> NoiseScale:
        if n <= 0:
            return cls(g_sq, trace_sigma, n, None, "not yet measurable: no samples")
        if not (math.isfinite(g_sq) and math.isfinite(trace_sigma)):
            return cls(g_sq, trace_sigma, n, None, "not measurable: non-finite estimate")
        if g_sq <= 0.0:
            return cls(
                g_sq,
                trace_sigma,
                n,
                None,
                "not yet measurable: the |G|^2 estimate is not positive "
                "(gradient signal is below the noise; average over more steps)",
            )
        if trace_sigma < 0.0:
            return cls(
                g_sq,
                trace_sigma,
                n,
                None,
                "not yet measurable: the tr(Sigma) estimate is negative "
                "(too few steps in the window)",
            )
        return cls(g_sq, trace_sigma, n, trace_sigma / g_sq)

    @classmethod
    def from_sums(cls, sum_g_sq: float, sum_trace_sigma: float, n: float) -> NoiseScale:
        """Ratio of window sums: avg(𝒮)/avg(|𝒢|^2), as docs/science.md prescribes."""
        if n <= 0:
            return cls.from_means(0.0, 0.0, 0)
        return cls.from_means(sum_g_sq / n, sum_trace_sigma / n, n)


def b_simple_from_sums(sum_g_sq: float, sum_trace_sigma: float) -> float | None:
    """B_simple = sum(𝒮) / sum(|𝒢|^2), or None where |G|^2 is not yet positive."""
    return NoiseScale.from_sums(sum_g_sq, sum_trace_sigma, 1.0).b_simple


class EMA:
    """Debiased exponential moving averages of |𝒢|^2 and 𝒮, ratio taken last.

    Averaging numerator and denominator separately is what keeps the ratio unbiased-ish;
    the Adam-style debiasing (divide by 1 - beta^t) removes the pull toward zero at start.
    """

    def __init__(self, beta: float = 0.99) -> None:
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"beta must be in [0, 1), got {beta}")
        self.beta = beta
        self._g_sq = 0.0
        self._trace_sigma = 0.0
        self._weight = 0.0
        self.count = 0

    def update(self, g_sq: float, trace_sigma: float) -> None:
        b = self.beta
        self._g_sq = b * self._g_sq + (1.0 - b) * g_sq
        self._trace_sigma = b * self._trace_sigma + (1.0 - b) * trace_sigma
        self._weight = b * self._weight + (1.0 - b)
        self.count += 1

    @property
    def value(self) -> NoiseScale:
        if self._weight == 0.0:
            return NoiseScale.from_means(0.0, 0.0, 0)
        return NoiseScale.from_means(
            self._g_sq / self._weight, self._trace_sigma / self._weight, self.count
        )


# --- Critical batch size (docs/science.md, "Critical batch size from batch-size sweeps") ----


def steps_ratio(batch_size: float, b_crit: float) -> float:
    """S / S_min = 1 + B_crit / B: optimizer steps relative to the minimum."""
    return 1.0 + b_crit / batch_size


def examples_ratio(batch_size: float, b_crit: float) -> float:
    """E / E_min = 1 + B / B_crit: examples processed relative to the minimum."""
    return 1.0 + batch_size / b_crit


@dataclass(frozen=True)
class CriticalBatchFit:
    """S_min, E_min and B_crit = E_min / S_min for one loss target, with B_crit's interval.

    ``b_crit`` is None (with ``reason``) when the fitted S_min or E_min is not positive: the
    points do not follow the S-E hyperbola. ``b_crit_lo``/``b_crit_hi`` are its ``level``
    Fieller interval; both None when the interval is unbounded (S_min not significantly
    above zero: the sweep does not pin down where steps stop falling).
    """

    s_min: float
    e_min: float
    b_crit: float | None
    b_crit_lo: float | None
    b_crit_hi: float | None
    level: float
    n_points: int
    reason: str | None = None


def fit_critical_batch(
    batch_sizes: Sequence[float], steps: Sequence[float], *, level: float = 0.9
) -> CriticalBatchFit:
    """Fit S = S_min (1 + B_crit / B) to the steps each batch size took to reach one target.

    The model is linear in 1/B: S = S_min + E_min (1/B) with E_min = S_min B_crit
    (docs/science.md, Sec. 2.2-3). Steps to a target scatter in proportion to their size (a
    run at a small batch takes 10x the steps and is 10x as uncertain), so this is weighted
    least squares with weights 1/S^2: relative errors, every batch size counting alike.
    B_crit is the ratio of the slope to the intercept; its interval is Fieller's for that
    ratio, with Student-t quantiles on n - 2 degrees of freedom (the same construction as
    B_simple's interval).
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if len(batch_sizes) != len(steps):
        raise ValueError("batch_sizes and steps must have the same length")
    n = len(batch_sizes)
    if n < 3 or len(set(batch_sizes)) < 3:
        raise ValueError(
            "need at least 3 distinct batch sizes that reached the target, "
            f"got {len(set(batch_sizes))}"
        )
    if not all(b > 0 and math.isfinite(b) for b in batch_sizes):
        raise ValueError("batch sizes must be finite and positive")
    if not all(s > 0 and math.isfinite(s) for s in steps):
        raise ValueError("steps must be finite and positive")
    xs = [1.0 / b for b in batch_sizes]
    ys = [float(s) for s in steps]
    ws = [1.0 / (s * s) for s in ys]
    w_sum = sum(ws)
    x_mean = sum(w * x for w, x in zip(ws, xs, strict=True)) / w_sum
    y_mean = sum(w * y for w, y in zip(ws, ys, strict=True)) / w_sum
    sxx = sum(w * (x - x_mean) ** 2 for w, x in zip(ws, xs, strict=True))
    sxy = sum(w * (x - x_mean) * (y - y_mean) for w, x, y in zip(ws, xs, ys, strict=True))
    e_min = sxy / sxx  # slope
    s_min = y_mean - e_min * x_mean  # intercept
    if s_min <= 0 or e_min <= 0:
        return CriticalBatchFit(
            s_min,
            e_min,
            None,
            None,
            None,
            level,
            n,
            f"the points do not follow S = S_min(1 + B_crit/B) (fitted S_min={s_min:.3g}, "
            f"E_min={e_min:.3g}): steps do not fall with the batch size as the model says",
        )
    b_crit = e_min / s_min
    # Weighted residual variance and the covariance of (intercept, slope).
    resid = [y - (s_min + e_min * x) for x, y in zip(xs, ys, strict=True)]
    s2 = sum(w * r * r for w, r in zip(ws, resid, strict=True)) / (n - 2)
    var_slope = s2 / sxx
    var_icept = s2 * (1.0 / w_sum + x_mean**2 / sxx)
    cov = -x_mean * s2 / sxx
    lo, hi = _fieller(e_min, s_min, var_slope, var_icept, cov, level, n - 2)
    reason = None
    if lo is None:
        dof = n - 2
        reason = (
            f"B_crit is not determined at {level:.0%} confidence: the fitted S_min is not "
            "significantly above zero (steps may still be falling at the largest batch tried"
            + (
                f"; {n} batch sizes leave the fit {dof} degree{'s' if dof > 1 else ''} of "
                "freedom: run more batch sizes"
                if dof < 3
                else ""
            )
            + ")"
        )
    return CriticalBatchFit(s_min, e_min, b_crit, lo, hi, level, n, reason)


def _fieller(
    num: float, den: float, var_num: float, var_den: float, cov: float, level: float, df: float
) -> tuple[float | None, float | None]:
    """Fieller's ``level`` interval for num/den (jointly normal, t on ``df`` d.o.f.).

    (None, None) when it is unbounded: the denominator is not significantly non-zero. The
    lower end is clipped at 0 (the quantities here are non-negative, so no coverage is lost).
    """
    t = student_t_quantile(0.5 + level / 2.0, df)
    a = den * den - t * t * var_den
    if a <= 0.0:
        return None, None
    half_b = num * den - t * t * cov
    c = num * num - t * t * var_num
    disc = max(half_b * half_b - a * c, 0.0)
    ratio = num / den
    lo = (half_b - math.sqrt(disc)) / a
    hi = (half_b + math.sqrt(disc)) / a
    return max(0.0, min(lo, ratio)), max(hi, ratio)


def b_noise_from_sums(sum_g_h_g: float, sum_trace_h_sigma: float) -> float | None:
    """B_noise = tr(H Sigma) / (G^T H G) from window sums of the two-batch estimates.

    E[G_B^T H G_B] = G^T H G + tr(H Sigma)/B for a Hessian H independent of the batch (the
    quadratic-form analogue of eq. 1), so ``two_batch_estimates`` applied to the quadratic forms
    ``G_small^T H G_small`` and ``G_big^T H G_big`` gives unbiased G^T H G and tr(H Sigma); the
    ratio of their sums is B_noise, with the same "not yet measurable" rule as B_simple.
    """
    return b_simple_from_sums(sum_g_h_g, sum_trace_h_sigma)


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


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction for the regularised incomplete beta (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def _student_t_cdf(t: float, df: float) -> float:
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


@functools.lru_cache(maxsize=1024)  # pure; the server calls it once per bucket (2000/query)
def student_t_quantile(p: float, df: float) -> float:
    """Quantile of Student's t with ``df`` degrees of freedom (pure Python, ~1e-10 accurate)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if df <= 0:
        raise ValueError(f"df must be positive, got {df}")
    if p < 0.5:
        return -student_t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while _student_t_cdf(hi, df) < p:
        hi *= 2.0
        if hi > 1e12:
            return math.inf
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _student_t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


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

    @property
    def measurable(self) -> bool:
        return self.b_simple is not None


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
    total = float(sum(block_n))
    if len(block_n) <= n_blocks or total <= 0:
        return [float(x) for x in block_n], list(block_sum_g_sq), list(block_sum_trace_sigma)
    out_n: list[float] = []
    out_g: list[float] = []
    out_s: list[float] = []
    cum = 0.0
    cur_n = cur_g = cur_s = 0.0
    target = 1
    for n_b, g_b, s_b in zip(block_n, block_sum_g_sq, block_sum_trace_sigma, strict=True):
        cur_n += n_b
        cur_g += g_b
        cur_s += s_b
        cum += n_b
        # close the block once the running count reaches its share of the total
        if cum >= total * target / n_blocks - 1e-9 and target < n_blocks:
            out_n.append(cur_n)
            out_g.append(cur_g)
            out_s.append(cur_s)
            cur_n = cur_g = cur_s = 0.0
            target += 1
    if cur_n > 0:
        out_n.append(cur_n)
        out_g.append(cur_g)
        out_s.append(cur_s)
    return out_n, out_g, out_s


#: Blocks an interval is computed from: more are merged into this many (``reblock``): long
#: compared with the step-to-step correlation, and enough for the jackknife's t quantile.
INTERVAL_BLOCKS = 30


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
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    merged = reblock(block_n, block_sum_g_sq, block_sum_trace_sigma, max_blocks or INTERVAL_BLOCKS)
    rows = [
        (n_b, g_b, s_b)
        for n_b, g_b, s_b in zip(*merged, strict=True)
        if n_b > 0 and math.isfinite(g_b) and math.isfinite(s_b)
    ]
    n_total = float(sum(r[0] for r in rows))
    m = len(rows)
    if m < 2:
        return NoiseScaleInterval(
            level,
            n_total,
            m,
            None,
            None,
            None,
            f"not yet measurable: an interval needs at least 2 blocks of steps, got {m}",
        )
    g_mean = sum(r[1] for r in rows) / n_total
    s_mean = sum(r[2] for r in rows) / n_total
    # Delete-one-block jackknife for a (weighted) mean: var = (1/m) sum n_j/(N-n_j) (x_j - x)^2
    var_g = var_s = cov_gs = 0.0
    for n_b, g_b, s_b in rows:
        w = n_b / (n_total - n_b)
        dg = g_b / n_b - g_mean
        ds = s_b / n_b - s_mean
        var_g += w * dg * dg
        var_s += w * ds * ds
        cov_gs += w * dg * ds
    var_g /= m
    var_s /= m
    cov_gs /= m
    t = student_t_quantile(0.5 + level / 2.0, m - 1)
    se_g, se_s = math.sqrt(var_g), math.sqrt(var_s)
    # Both true quantities are >= 0, so clipping the lower ends at 0 never loses coverage.
    g_iv = Interval(g_mean, max(0.0, g_mean - t * se_g), max(0.0, g_mean + t * se_g))
    s_iv = Interval(s_mean, max(0.0, s_mean - t * se_s), max(0.0, s_mean + t * se_s))
    point = NoiseScale.from_means(g_mean, s_mean, n_total)
    if point.b_simple is None:
        return NoiseScaleInterval(level, n_total, m, g_iv, s_iv, None, point.reason)
    # Fieller: {rho : (s - rho g)^2 <= t^2 (var_s - 2 rho cov + rho^2 var_g)}
    lo, hi = _fieller(s_mean, g_mean, var_s, var_g, cov_gs, level, m - 1)
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


# --- The current B_simple of a run -------------------------------------------------------
#
# One definition, used by every page and endpoint that says "B_simple now": the trailing window
# of a run's samples that holds at least ``CURRENT_FRACTION`` of them and at least
# ``CURRENT_MIN_SAMPLES``, grown (doubling, back toward the start of the run) until its
# ``level`` interval is no wider than ``CURRENT_MAX_REL_WIDTH`` times the estimate, or until it
# holds the whole run. The fraction keeps the window recent while the noise scale moves; the
# width bound keeps it long enough to say something. Below ``CURRENT_MIN_SAMPLES`` samples, or
# when even the final window's |G|^2 is not significantly positive, there is no number.

#: Share of a run's samples the current window holds at least (the most recent ones).
CURRENT_FRACTION = 0.1
#: Fewest samples the current B_simple is ever computed from.
CURRENT_MIN_SAMPLES = 64
#: The window grows until (hi - lo) / B_simple of its interval is at most this.
CURRENT_MAX_REL_WIDTH = 1.0


#: The trailing blocks of a run that hold at least a given number of samples (oldest first).
Trailing = Callable[[int], tuple[Sequence[float], Sequence[float], Sequence[float]]]


def current_noise_scale(
    n_total: float, trailing: Trailing, *, level: float = 0.9
) -> tuple[float, NoiseScaleInterval]:
    """The current B_simple of a run of ``n_total`` samples, by the rule above.

    ``trailing(target)`` gives the run's last blocks (counts and sums of |𝒢|^2 and 𝒮, oldest
    first) holding at least ``target`` samples, or all of them: raw samples (blocks of one)
    or storage blocks, whichever the caller has. Returns the samples the window holds and its
    interval (``b_simple`` None, with ``reason``, when not yet measurable).
    """
    if n_total < CURRENT_MIN_SAMPLES:
        return 0.0, NoiseScaleInterval(
            level,
            n_total,
            0,
            None,
            None,
            None,
            f"not yet measurable: {n_total:,.0f} samples so far; the current B_simple needs at "
            f"least {CURRENT_MIN_SAMPLES}",
        )
    target = max(math.ceil(CURRENT_FRACTION * n_total), CURRENT_MIN_SAMPLES)
    while True:
        block_n, block_g, block_s = trailing(target)
        interval = interval_from_blocks(block_n, block_g, block_s, level=level)
        used = float(sum(block_n))
        b_iv = interval.b_simple
        if used >= n_total or (
            b_iv is not None
            and b_iv.value > 0
            and (b_iv.hi - b_iv.lo) <= CURRENT_MAX_REL_WIDTH * b_iv.value
        ):
            return used, interval
        target *= 2


def current_window(
    block_n: Sequence[float],
    block_sum_g_sq: Sequence[float],
    block_sum_trace_sigma: Sequence[float],
    *,
    level: float = 0.9,
) -> tuple[int, NoiseScaleInterval]:
    """``current_noise_scale`` over a run's blocks in a list (oldest first): how many trailing
    blocks the window takes (whole blocks, from the end, until their samples reach the
    window's target) and its interval."""
    if not len(block_n) == len(block_sum_g_sq) == len(block_sum_trace_sigma):
        raise ValueError("block_n, block_sum_g_sq and block_sum_trace_sigma differ in length")
    taken = [0]

    def trailing(target: int) -> tuple[Sequence[float], Sequence[float], Sequence[float]]:
        k, count = 0, 0.0
        while k < len(block_n) and count < target:
            k += 1
            count += block_n[-k]
        taken[0] = k
        return block_n[-k:], block_sum_g_sq[-k:], block_sum_trace_sigma[-k:]

    _, interval = current_noise_scale(float(sum(block_n)), trailing, level=level)
    return taken[0], interval


# --- Acting on the noise scale: statistical efficiency, goodput, batch-size targets ----------
#
# (Used by noisescope.schedule and noisescope.recommend.) In docs/science.md's model
# (McCandlish et al. 2018, Sec. 2.2-3) reaching a loss target costs E = E_min (1 + B/B_crit)
# examples and S = S_min (1 + B_crit/B) steps. With B_crit ≈ φ (the measured noise scale,
# B_simple), the per-example progress of batch B relative to a reference batch B0 is
# E(B0)/E(B) = (φ + B0)/(φ + B): the "statistical efficiency" of AdaptDL/Pollux (Qiao et al.,
# OSDI 2021). Their "goodput" is throughput × efficiency: useful examples per second. B0 only
# rescales efficiency and goodput, never their argmax; B0 = 0 gives E_min/E = φ/(φ + B), the
# fraction of the best possible per-example progress.

__all__ += [
    "goodput",
    "goodput_optimal_batch",
    "interpolate_throughput",
    "scaled_lr",
    "statistical_efficiency",
]


def statistical_efficiency(
    batch_size: float, noise_scale: float, reference_batch: float = 0.0
) -> float:
    """(φ + B0) / (φ + B): per-example progress at ``batch_size`` relative to ``reference_batch``.

    φ = ``noise_scale`` (B_simple as the estimate of B_crit). Pollux eq. 1; equals
    examples_ratio(B0, φ) / examples_ratio(B, φ) of docs/science.md's S-E model, and with
    B0 = 0 it is E_min / E = 1 / examples_ratio(B, φ).
    """
    if not batch_size > 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if reference_batch < 0:
        raise ValueError(f"reference_batch must be >= 0, got {reference_batch}")
    if not noise_scale >= 0 or not math.isfinite(noise_scale):
        raise ValueError(f"noise_scale must be finite and >= 0, got {noise_scale}")
    if noise_scale == 0.0 and reference_batch == 0.0:
        return 0.0
    return (noise_scale + reference_batch) / (noise_scale + batch_size)


def goodput(
    throughput: float, batch_size: float, noise_scale: float, reference_batch: float = 0.0
) -> float:
    """Pollux goodput = throughput × statistical efficiency (useful examples per second).

    ``throughput`` is examples (or tokens) per second measured at ``batch_size``.
    """
    if throughput < 0:
        raise ValueError(f"throughput must be >= 0, got {throughput}")
    return throughput * statistical_efficiency(batch_size, noise_scale, reference_batch)


def interpolate_throughput(
    batch_sizes: Sequence[float], throughputs: Sequence[float], batch_size: float
) -> float | None:
    """Throughput at ``batch_size`` from measurements, linear in log-log between neighbours.

    Throughput typically rises like a power of B and then saturates, which is piecewise linear
    in log-log. No extrapolation: None outside the measured range.
    """
    if len(batch_sizes) != len(throughputs):
        raise ValueError("batch_sizes and throughputs must have the same length")
    points = sorted(zip(batch_sizes, throughputs, strict=True))
    if not points:
        return None
    for b, t in points:
        if not b > 0 or not t > 0:
            raise ValueError(f"batch sizes and throughputs must be positive, got ({b}, {t})")
    if batch_size < points[0][0] or batch_size > points[-1][0]:
        return None
    for i in range(len(points) - 1):
        (b_lo, t_lo), (b_hi, t_hi) = points[i], points[i + 1]
        if b_lo <= batch_size <= b_hi:
            if b_hi == b_lo:
                return t_lo
            frac = math.log(batch_size / b_lo) / math.log(b_hi / b_lo)
            return math.exp(math.log(t_lo) + frac * (math.log(t_hi) - math.log(t_lo)))
    return points[0][1]  # a single measured batch size


def goodput_optimal_batch(
    batch_sizes: Sequence[float],
    throughputs: Sequence[float],
    noise_scale: float,
    candidates: Sequence[float] | None = None,
    reference_batch: float = 0.0,
) -> tuple[float, float]:
    """The batch size maximising goodput, and that goodput (Pollux's batch-size choice).

    Candidates are the measured batch sizes plus ``candidates`` inside the measured range
    (throughput interpolated by ``interpolate_throughput``); ties go to the smaller batch.
    """
    pool = sorted(set(batch_sizes) | set(candidates or ()))
    best: tuple[float, float] | None = None
    for b in pool:
        t = interpolate_throughput(batch_sizes, throughputs, b)
        if t is None:
            continue
        g = goodput(t, b, noise_scale, reference_batch)
        if best is None or g > best[1] * (1.0 + 1e-12):
            best = (b, g)
    if best is None:
        raise ValueError("need at least one measured (batch size, throughput) pair")
    return best


def scaled_lr(base_lr: float, batch_size: float, base_batch_size: float, rule: str) -> float:
    """Learning rate at ``batch_size`` when ``base_lr`` was tuned at ``base_batch_size``.

    "linear": lr ∝ B (Goyal et al. 2017; plain SGD well below B_crit, where a step of batch B
    does the work of B/B0 small steps: S ≈ S_min B_crit/B in docs/science.md's model); "sqrt":
    lr ∝ √B (Adam-family optimizers; Malladi et al. 2022); "none" (or "constant"): unchanged.
    """
    powers = {"linear": 1.0, "sqrt": 0.5, "none": 0.0, "constant": 0.0}
    if rule not in powers:
        raise ValueError(f"lr rule must be 'linear', 'sqrt', 'constant' or 'none', got {rule!r}")
    if not (batch_size > 0 and base_batch_size > 0):
        raise ValueError("batch sizes must be positive")
    return float(base_lr * (batch_size / base_batch_size) ** powers[rule])


# --- How far a task parallelises (docs/science.md's S-E model, B_crit known) ---------------
#
# With N devices of ``per_device_batch`` each, B = N b and the run takes S = S_min (1 + B_crit/B)
# steps. Taking the step time as independent of N (ideal data parallelism: what the model
# alone predicts, before any communication cost), doubling N speeds training up by
# S(B)/S(2B) = (1 + B_crit/B) / (1 + B_crit/(2B)), which falls from 2x toward 1x as B passes
# B_crit, while the examples processed grow as E = E_min (1 + B/B_crit).

__all__ += ["compute_waste", "doubling_speedup", "parallelism_limit"]


def doubling_speedup(batch_size: float, b_crit: float) -> float:
    """S(B) / S(2B): how much faster a run gets when its batch (its device count) doubles."""
    return steps_ratio(batch_size, b_crit) / steps_ratio(2.0 * batch_size, b_crit)


def compute_waste(batch_size: float, b_crit: float) -> float:
    """1 - E_min/E = B / (B + B_crit): the share of the examples processed beyond the minimum."""
    return batch_size / (batch_size + b_crit)


def parallelism_limit(b_crit: float, per_device_batch: float, min_speedup: float = 1.5) -> float:
    """Devices N* past which doubling the devices speeds training up by less than
    ``min_speedup`` (between 1 and 2).

    Solving doubling_speedup(N b, B_crit) >= s for N: with u = B_crit/(N b),
    (1 + u)/(1 + u/2) >= s  <=>  u >= (s - 1)/(1 - s/2), so N* = (B_crit/b)(1 - s/2)/(s - 1).
    At s = 1.5, N* b = B_crit/2, where a third of the compute is already beyond the minimum.
    """
    if not 1.0 < min_speedup < 2.0:
        raise ValueError(f"min_speedup must be between 1 and 2 (exclusive), got {min_speedup}")
    if not (b_crit > 0 and per_device_batch > 0):
        raise ValueError("b_crit and per_device_batch must be positive")
    return (b_crit / per_device_batch) * (1.0 - min_speedup / 2.0) / (min_speedup - 1.0)


# --- The local critical batch size of a branch sweep -----------------------------------------
# (docs/science.md, "Measuring the critical batch size directly (branching)")
#
# Continuations of one checkpoint at batch sizes b_0 < b_1 < ..., all trained on the same number
# of examples, end at losses L(b). The local critical batch size is the largest batch whose loss
# stays within a relative tolerance eps of the smallest batch's: L(b) <= (1 + eps) L(b_0). On
# the measured grid that is a step function; we read the crossing of
# D(b) = L(b) - (1 + eps) L(b_0) through zero by linear interpolation in log b between the last
# batch inside and the first outside, so the answer resolves finer than the multiplier grid.
# The interval comes from the curve's uncertainty over seeds. Seed j of every batch size is
# expected to use the same data order (the first examples of one stream), so the differences
# D_j(b) = L_j(b) - (1 + eps) L_j(b_0) are paired and much less noisy than the losses; D's
# standard error is that of the seed mean of D_j(b) (unpaired, when the seed counts differ:
# the root sum of both means' squared standard errors). Student-t on seeds - 1 degrees of
# freedom; the lower end is where D + t se first crosses zero, the upper end where D - t se does.

__all__ += ["LocalCriticalBatch", "local_critical_batch"]


@dataclass(frozen=True)
class LocalCriticalBatch:
    """A branch sweep's local critical batch size with its ``level`` interval.

    ``b_crit`` is None (with ``reason``) when it cannot be read off: every batch tried stayed
    within the tolerance (then ``b_crit_lo`` is the largest batch tried: a lower bound only).
    ``b_crit_hi`` is None when the upper end is above the largest batch tried; both ends None
    with one seed (no spread to measure). ``mean_loss`` is per batch size, ``threshold`` the
    loss the tolerance allows.
    """

    b_crit: float | None
    b_crit_lo: float | None
    b_crit_hi: float | None
    level: float
    epsilon: float
    threshold: float
    batch_sizes: tuple[float, ...]
    mean_loss: tuple[float, ...]
    loss_se: tuple[float | None, ...]
    seeds: int
    reason: str | None = None


def _first_crossing(xs: Sequence[float], ds: Sequence[float]) -> float | None:
    """Where ``ds`` first goes from <= 0 to > 0, interpolated linearly in log x (None: never);
    ``xs[0]`` when it is already above zero at the first point."""
    if ds[0] > 0:
        return xs[0]
    for i in range(1, len(xs)):
        if ds[i] > 0:
            lx0, lx1 = math.log(xs[i - 1]), math.log(xs[i])
            frac = -ds[i - 1] / (ds[i] - ds[i - 1])
            return math.exp(lx0 + frac * (lx1 - lx0))
    return None


def local_critical_batch(
    batch_sizes: Sequence[float],
    losses: Sequence[Sequence[float]],
    *,
    epsilon: float = 0.01,
    level: float = 0.9,
) -> LocalCriticalBatch:
    """The local critical batch size from the losses after one budget at each batch size.

    ``losses[i]`` holds the evaluation losses of the continuations at ``batch_sizes[i]`` (one
    per seed); the smallest batch size is the reference. See the block comment above for the
    rule and the interval.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon must be a positive relative tolerance, got {epsilon}")
    if len(batch_sizes) != len(losses):
        raise ValueError("batch_sizes and losses must have the same length")
    if len(batch_sizes) < 2 or len(set(batch_sizes)) != len(batch_sizes):
        raise ValueError("need at least 2 distinct batch sizes")
    if not all(b > 0 and math.isfinite(b) for b in batch_sizes):
        raise ValueError("batch sizes must be finite and positive")
    order = sorted(range(len(batch_sizes)), key=lambda i: batch_sizes[i])
    xs = [float(batch_sizes[i]) for i in order]
    rows = [[float(v) for v in losses[i]] for i in order]
    if any(not row for row in rows):
        raise ValueError("every batch size needs at least one loss")
    if any(not math.isfinite(v) for v in rows[0]):
        raise ValueError("the smallest batch's losses must be finite (it is the reference)")
    # A diverged continuation (non-finite loss) is simply far outside the tolerance.
    means = [math.inf if any(not math.isfinite(v) for v in r) else sum(r) / len(r) for r in rows]
    seeds = min(len(r) for r in rows)
    paired = all(len(r) == len(rows[0]) for r in rows)

    def se(values: list[float]) -> float | None:
        if len(values) < 2 or any(not math.isfinite(v) for v in values):
            return None
        m = sum(values) / len(values)
        return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1) / len(values))

    threshold = (1.0 + epsilon) * means[0]
    ds = [m - threshold for m in means]
    if paired:
        ses = [
            se([v - (1.0 + epsilon) * v0 for v, v0 in zip(r, rows[0], strict=True)]) for r in rows
        ]
    else:
        se_0 = se(rows[0])
        ses = [None if se_0 is None else epsilon * se_0]
        for r in rows[1:]:
            se_r = se(r)
            both = se_r is not None and se_0 is not None
            ses.append(math.sqrt(se_r**2 + ((1.0 + epsilon) * se_0) ** 2) if both else None)  # type: ignore[operator]
    value = _first_crossing(xs, ds)

    def result(
        b: float | None, lo: float | None, hi: float | None, reason: str | None
    ) -> LocalCriticalBatch:
        return LocalCriticalBatch(
            b, lo, hi, level, epsilon, threshold, tuple(xs), tuple(means), tuple(ses), seeds, reason
        )

    if value is None:
        return result(
            None,
            xs[-1],
            None,
            f"every batch size up to {xs[-1]:g} stayed within {epsilon:g} (relative) of the "
            f"smallest batch's loss: the local critical batch is above {xs[-1]:g}; branch with "
            "larger multipliers",
        )
    if seeds < 2:
        return result(
            value, None, None, "one seed per batch size: no interval (run 2 or more seeds)"
        )
    t = student_t_quantile(0.5 + level / 2.0, seeds - 1)
    # A diverged batch (infinite D, no standard error) is outside at any confidence.
    spread = [t * (x or 0.0) for x in ses]
    upper = [d + w for d, w in zip(ds, spread, strict=True)]
    lower = [d - w for d, w in zip(ds, spread, strict=True)]
    lo = _first_crossing(xs, upper)
    hi = _first_crossing(xs, lower)
    reason = None
    if hi is None:
        reason = (
            f"the upper end is above the largest batch tried ({xs[-1]:g}) at {level:.0%} "
            "confidence: more seeds or larger multipliers narrow it"
        )
    return result(value, value if lo is None else min(lo, value), hi, reason)
