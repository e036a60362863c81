"""The two-batch estimator (docs/science.md, App. A.1): unbiased |G|^2 and tr(Sigma) from one
step's squared norms at two batch sizes, their window sums, the EMA, B_simple and B_noise.

Why sums: both unbiased estimators are linear in the measured squared norms, so a window's
estimate is the ratio of the *summed* numerator and denominator (never the mean of per-step
ratios, which is biased and unstable).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def two_batch_estimates(
    b_small: float, b_big: float, g_small_sq: float, g_big_sq: float
) -> tuple[float, float]:
    """Unbiased |G|^2 and tr(Sigma) from one step's squared norms at two batch sizes.

    Solves E|G_B|^2 = |G|^2 + tr(Sigma)/B  (eq. 1) at B_small and B_big (App. A.1)::

        |𝒢|^2 = (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
        𝒮     = (|G_small|^2 - |G_big|^2) / (1/B_small - 1/B_big)

    Either may be negative for a single step; only window averages are meaningful.
    """
    _two_batch_denominators(b_small, b_big)
    g_sq, trace_sigma = two_batch_expressions(b_small, b_big, g_small_sq, g_big_sq)
    return float(g_sq), float(trace_sigma)


def two_batch_expressions(
    b_small: Any, b_big: Any, g_small_sq: Any, g_big_sq: Any
) -> tuple[Any, Any]:
    """``two_batch_estimates``' expressions, unchecked, over anything with ``+ - * /``: floats,
    or the server's SQL columns (an SQL expression of the same operations in the same order,
    which SQLite evaluates in IEEE doubles as Python does: the same floats). The one place
    the formula is written; ``two_batch_estimate_columns`` is it element for element with
    the denominators computed once."""
    g_sq = (b_big * g_big_sq - b_small * g_small_sq) / (b_big - b_small)
    trace_sigma = (g_small_sq - g_big_sq) / (1.0 / b_small - 1.0 / b_big)
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


def _b_simple_rule(g_sq: float, trace_sigma: float, n: float) -> tuple[float | None, str | None]:
    """B_simple = tr(Sigma)/|G|^2 from a window's means, or None and why it cannot be
    measured yet: the rule of ``NoiseScale``, as a pair for callers that need no object."""
    if n <= 0:
        return None, "not yet measurable: no samples"
    if not (math.isfinite(g_sq) and math.isfinite(trace_sigma)):
        return None, "not measurable: non-finite estimate"
    if g_sq <= 0.0:
        return None, (
            "not yet measurable: the |G|^2 estimate is not positive "
            "(gradient signal is below the noise; average over more steps)"
        )
    if trace_sigma < 0.0:
        return None, (
            "not yet measurable: the tr(Sigma) estimate is negative (too few steps in the window)"
        )
    return trace_sigma / g_sq, None


def b_simple_and_reason(
    sum_g_sq: float, sum_trace_sigma: float, n: float
) -> tuple[float | None, str | None]:
    """``NoiseScale.from_sums``'s ``b_simple`` and ``reason`` without building the object: the
    server reads thousands of bucket sums per series."""
    if n <= 0:
        return _b_simple_rule(0.0, 0.0, 0)
    return _b_simple_rule(sum_g_sq / n, sum_trace_sigma / n, n)


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
        return cls(g_sq, trace_sigma, n, *_b_simple_rule(g_sq, trace_sigma, n))

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


def b_noise_from_sums(sum_g_h_g: float, sum_trace_h_sigma: float) -> float | None:
    """B_noise = tr(H Sigma) / (G^T H G) from window sums of the two-batch estimates.

    E[G_B^T H G_B] = G^T H G + tr(H Sigma)/B for a Hessian H independent of the batch (the
    quadratic-form analogue of eq. 1), so ``two_batch_estimates`` applied to the quadratic forms
    ``G_small^T H G_small`` and ``G_big^T H G_big`` gives unbiased G^T H G and tr(H Sigma); the
    ratio of their sums is B_noise, with the same "not yet measurable" rule as B_simple.
    """
    return b_simple_from_sums(sum_g_h_g, sum_trace_h_sigma)
