"""The S-E model (docs/science.md, "Critical batch size from batch-size sweeps"): steps and
examples relative to their minimum, the fit of B_crit to a sweep, and how far a task
parallelises once B_crit is known."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ._stats import check_level, check_positive, fieller, weighted_line_fit


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
    check_level(level)
    if len(batch_sizes) != len(steps):
        raise ValueError("batch_sizes and steps must have the same length")
    n = len(batch_sizes)
    if n < 3 or len(set(batch_sizes)) < 3:
        raise ValueError(
            "need at least 3 distinct batch sizes that reached the target, "
            f"got {len(set(batch_sizes))}"
        )
    for b in batch_sizes:
        check_positive("batch size", b)
    for s in steps:
        check_positive("steps", s)
    xs = [1.0 / b for b in batch_sizes]
    ys = [float(s) for s in steps]
    line = weighted_line_fit(xs, ys, [1.0 / (s * s) for s in ys])
    e_min, s_min = line.slope, line.intercept
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
    lo, hi = fieller(e_min, s_min, line.var_slope, line.var_intercept, line.cov, level, n - 2)
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


# --- How far a task parallelises (docs/science.md's S-E model, B_crit known) ---------------
#
# With N devices of ``per_device_batch`` each, B = N b and the run takes S = S_min (1 + B_crit/B)
# steps. Taking the step time as independent of N (ideal data parallelism: what the model
# alone predicts, before any communication cost), doubling N speeds training up by
# S(B)/S(2B) = (1 + B_crit/B) / (1 + B_crit/(2B)), which falls from 2x toward 1x as B passes
# B_crit, while the examples processed grow as E = E_min (1 + B/B_crit).


def doubling_speedup(batch_size: float, b_crit: float) -> float:
    """S(B) / S(2B): how much faster a run gets when its batch (its device count) doubles.

    (1 + B_crit/B) / (1 + B_crit/2B) = 1 + B_crit / (2B + B_crit): written so that every
    rounding step is monotone, so it never rises again as B grows (a plan's rows stay past
    the limit once past it, even where it is within an ulp of 1).
    """
    return 1.0 + b_crit / (2.0 * batch_size + b_crit)


def compute_waste(batch_size: float, b_crit: float) -> float:
    """1 - E_min/E = B / (B + B_crit): the share of the examples processed beyond the minimum."""
    return batch_size / (batch_size + b_crit)


#: The default for "a doubling of the devices still pays": 1.5x faster (at N* b = B_crit/2).
MIN_SPEEDUP = 1.5


def parallelism_limit(
    b_crit: float, per_device_batch: float, min_speedup: float = MIN_SPEEDUP
) -> float:
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
