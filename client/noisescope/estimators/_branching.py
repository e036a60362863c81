"""The local critical batch size of a branch sweep (docs/science.md, "Measuring the critical
batch size directly (branching)")."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ._stats import student_t_quantile

__all__ = ["LocalCriticalBatch", "local_critical_batch"]

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
