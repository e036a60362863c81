"""The gradient-noise-scale estimators: the one place where noisescope's maths lives.

Equation numbers refer to ``shared/science.md`` (McCandlish et al. 2018, "An Empirical Model
of Large-Batch Training", Appendix A.1 and Sections 2.2-3). Pure Python on purpose: the client
must import it in any training job without numpy, and the server and dashboard call the same
functions on sums computed in SQL.

Why sums: both unbiased estimators are linear in the measured squared norms, so a window's
estimate is the ratio of the *summed* numerator and denominator (never the mean of per-step
ratios, which is biased and unstable).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "EMA",
    "CriticalBatchFit",
    "NoiseScale",
    "b_simple_from_sums",
    "examples_ratio",
    "fit_critical_batch",
    "steps_ratio",
    "two_batch_estimates",
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
    if not b_big > b_small > 0:
        raise ValueError(
            f"need 0 < b_small < b_big, got b_small={b_small}, b_big={b_big}: "
            "the two batch sizes must differ (one process and no accumulation has only one)"
        )
    g_sq = (b_big * g_big_sq - b_small * g_small_sq) / (b_big - b_small)
    trace_sigma = (g_small_sq - g_big_sq) / (1.0 / b_small - 1.0 / b_big)
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
        """Ratio of window sums: avg(𝒮)/avg(|𝒢|^2), the estimator science.md prescribes."""
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

    def update_norms(
        self, b_small: float, b_big: float, g_small_sq: float, g_big_sq: float
    ) -> None:
        self.update(*two_batch_estimates(b_small, b_big, g_small_sq, g_big_sq))

    @property
    def value(self) -> NoiseScale:
        if self._weight == 0.0:
            return NoiseScale.from_means(0.0, 0.0, 0)
        return NoiseScale.from_means(
            self._g_sq / self._weight, self._trace_sigma / self._weight, self.count
        )


# --- Critical batch size (science.md, "Critical batch size from batch-size sweeps") ---------


def steps_ratio(batch_size: float, b_crit: float) -> float:
    """S / S_min = 1 + B_crit / B: optimizer steps relative to the minimum."""
    return 1.0 + b_crit / batch_size


def examples_ratio(batch_size: float, b_crit: float) -> float:
    """E / E_min = 1 + B / B_crit: examples processed relative to the minimum."""
    return 1.0 + batch_size / b_crit


@dataclass(frozen=True)
class CriticalBatchFit:
    """S_min, E_min and B_crit = E_min / S_min for one loss target, with standard errors."""

    s_min: float
    e_min: float
    b_crit: float
    b_crit_stderr: float | None
    n_points: int


def fit_critical_batch(
    batch_sizes: Sequence[float], steps: Sequence[float]
) -> CriticalBatchFit:
    """Fit S = S_min (1 + B_crit / B) to the steps each batch size took to reach one target.

    The model is linear in 1/B: S = S_min + (S_min B_crit) (1/B), so ordinary least squares on
    (1/B, S) gives S_min (intercept) and E_min = S_min B_crit (slope). The examples form
    E = B S = E_min (1 + B / B_crit) is the same model, so fitting S is enough.
    """
    if len(batch_sizes) != len(steps):
        raise ValueError("batch_sizes and steps must have the same length")
    n = len(batch_sizes)
    if n < 3 or len(set(batch_sizes)) < 3:
        raise ValueError(
            f"need at least 3 distinct batch sizes that reached the target, got {len(set(batch_sizes))}"
        )
    xs = [1.0 / b for b in batch_sizes]
    ys = [float(s) for s in steps]
    x_mean = sum(xs) / n
    y_mean = sum(ys) / n
    sxx = sum((x - x_mean) ** 2 for x in xs)
    sxy = sum((x - x_mean) * (y - y_mean) for x, y in zip(xs, ys, strict=True))
    e_min = sxy / sxx
    s_min = y_mean - e_min * x_mean
    if s_min <= 0 or e_min <= 0:
        raise ValueError(
            f"the S-E hyperbola does not fit these points (S_min={s_min:.3g}, "
            f"E_min={e_min:.3g}); the batch sizes may not span the critical batch size"
        )
    b_crit = e_min / s_min
    stderr: float | None = None
    if n > 2:
        # Delta method on B_crit = slope / intercept with the OLS covariance.
        resid = [y - (s_min + e_min * x) for x, y in zip(xs, ys, strict=True)]
        s2 = sum(r * r for r in resid) / (n - 2)
        var_slope = s2 / sxx
        var_icept = s2 * (1.0 / n + x_mean**2 / sxx)
        cov = -x_mean * s2 / sxx
        d_slope = 1.0 / s_min
        d_icept = -e_min / s_min**2
        var = d_slope**2 * var_slope + d_icept**2 * var_icept + 2 * d_slope * d_icept * cov
        stderr = math.sqrt(max(var, 0.0))
    return CriticalBatchFit(s_min=s_min, e_min=e_min, b_crit=b_crit, b_crit_stderr=stderr, n_points=n)
