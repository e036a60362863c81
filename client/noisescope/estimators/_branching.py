"""The local critical batch size of a branch sweep (docs/science.md, "Measuring the critical
batch size directly (branching)")."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from ._stats import check_level, check_positive, student_t_quantile

# Continuations of one checkpoint at batch sizes b_0 < b_1 < ..., all trained on the same number
# of examples, end at losses L(b). The local critical batch size is the largest batch whose loss
# stays within a relative tolerance eps of the smallest batch's: L(b) <= (1 + eps) L(b_0). On
# the measured grid that is a step function; we read the crossing of
# D(b) = L(b) - (1 + eps) L(b_0) through zero by linear interpolation in log b between the last
# batch inside (b_i) and the first outside (b_i+1), so the answer resolves finer than the
# multiplier grid, but only where the grid resolves the curve:
#
# - The grid cannot place the crossing inside the cell [b_i, b_i+1], so no interval is narrower
#   than that cell: the lower end is at most b_i, the upper end at least b_i+1.
# - The reading is a bracket, not a number (b_crit None, b_crit_lo/hi the cell, the
#   log-linear reading kept as b_crit_interpolated), when
#   * the crossing lies in the first cell (i = 0): D(b_0) = -eps L(b_0) holds by construction,
#     so the interpolated position, 1 / J_0 of the way across (J_0 the jump in units of
#     eps L(b_0)), is set by the jump's ratio to eps, not by a measured shape of the curve; or
#   * the curve bends inside the cell: its jump J_i = D(b_i+1) - D(b_i) is more than
#     MAX_RESOLVED_JUMP times the rise over the cell before, J_i-1 (or than eps L(b_0), one
#     tolerance, if that rise was smaller or the curve fell there). A straight line through the
#     cell's ends places the crossing well only while the curve's slope changes little from one
#     grid step to the next; a jump of many times the previous step's (the loss turning over,
#     or a diverged branch, somewhere inside the cell) puts the interpolated crossing near b_i
#     whatever the true shape, and it could lie anywhere in the cell. A steep but smooth curve
#     (rising 7 eps, then 12 eps per doubling, as least squares does with eps = 0.02) stays a
#     number: linear interpolation there is within 4% of the exact crossing.
#   The cure is the grid: a smaller base batch, or finer multipliers inside the cell.
#
# The interval comes from the curve's uncertainty over seeds. Seed j of every batch size is
# expected to use the same data order (the first examples of one stream), so the differences
# D_j(b) = L_j(b) - (1 + eps) L_j(b_0) are paired and much less noisy than the losses; D's
# standard error is that of the seed mean of D_j(b) (unpaired, when the seed counts differ:
# the root sum of both means' squared standard errors). Student-t on seeds - 1 degrees of
# freedom; the lower end is where D + t se first crosses zero, the upper end where D - t se does;
# then widened to the crossing's cell as above.

#: How many times the rise of D over the previous grid step (at least one tolerance, eps L(b_0))
#: its jump across the crossing's cell may be for the grid to resolve the crossing (see the block
#: comment): a slope that changes by up to 4x per step still leaves a log-linear reading within
#: its cell; digits' "first doubling overshoots by ~30 eps" and divergence are far beyond it.
MAX_RESOLVED_JUMP = 4.0


@dataclass(frozen=True)
class LocalCriticalBatch:
    """A branch sweep's local critical batch size with its ``level`` interval.

    ``b_crit`` is None (with ``reason``) when it cannot be read off as a number:
    every batch tried stayed within the tolerance (then ``b_crit_lo`` is the largest batch
    tried and ``b_crit_hi`` None: a lower bound only), or the grid does not resolve the crossing
    (a bracket: ``b_crit_lo`` and ``b_crit_hi`` are the grid points around it, or wider, and
    ``b_crit_interpolated`` the log-linear reading, not to be taken as a measurement).
    ``b_crit_hi`` is None when the upper end is above the largest batch tried; both ends None
    for a resolved crossing with one seed (no spread to measure). A resolved interval always
    spans at least the grid cell around the crossing. ``mean_loss`` is per batch size,
    ``threshold`` the loss the tolerance allows.
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
    b_crit_interpolated: float | None = None

    @property
    def bracketed(self) -> bool:
        """The crossing lies between ``b_crit_lo`` and ``b_crit_hi``, unresolved by the grid."""
        return self.b_crit is None and self.b_crit_lo is not None and self.b_crit_hi is not None


def _first_crossing(xs: Sequence[float], ds: Sequence[float]) -> float | None:
    """Where ``ds`` first goes from <= 0 to > 0, interpolated linearly in log x (None: never);
    ``xs[0]`` when it is already above zero at the first point."""
    if ds[0] > 0:
        return xs[0]
    for i in range(1, len(xs)):
        if ds[i] > 0:
            lx0, lx1 = math.log(xs[i - 1]), math.log(xs[i])
            frac = -ds[i - 1] / (ds[i] - ds[i - 1])
            # from an infinitely low D (a loss beyond the float range below the reference's)
            # the fraction is nan or beyond the cell: the crossing is at the cell's far end
            frac = 1.0 if not 0.0 <= frac <= 1.0 else frac
            return min(max(math.exp(lx0 + frac * (lx1 - lx0)), xs[i - 1]), xs[i])
    return None


def epsilon_problem(epsilon: object) -> str | None:
    """Why ``epsilon`` is no relative loss tolerance (a finite number > 0), or None when it is:
    the rule of ``local_critical_batch``, ``noisescope.branch.plan`` and the server's check of
    a branch run's plan."""
    number = isinstance(epsilon, (int, float)) and not isinstance(epsilon, bool)
    if number and 0 < epsilon <= sys.float_info.max:  # type: ignore[operator]
        return None
    return f"epsilon must be a positive relative tolerance (e.g. 0.01), got {epsilon!r:.40}"


def _scale_of(values: Sequence[float]) -> float:
    """The power of two just above the largest magnitude in ``values`` (1 for all zero), kept
    inside the normal float range: dividing by it is exact, so the reading is the same at any
    scale and sums of squares of the scaled losses do not overflow."""
    top = max((abs(v) for v in values), default=0.0)
    exponent = math.frexp(top)[1] if top > 0 else 0
    return math.ldexp(1.0, max(-1021, min(exponent, 1023)))


def branch_mean_loss(losses: Sequence[float]) -> float:
    """One batch size's mean evaluation loss over its continuations (one per seed); inf when
    any of them diverged (a non-finite loss): such a batch is far outside any tolerance. Summed
    at the losses' own power-of-two scale, so finite losses near the float limit never
    overflow to a false divergence."""
    if any(not math.isfinite(v) for v in losses):
        return math.inf
    scale = _scale_of(losses)
    return sum(v / scale for v in losses) / len(losses) * scale


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
    check_level(level)
    problem = epsilon_problem(epsilon)
    if problem is not None:
        raise ValueError(problem)
    if len(batch_sizes) != len(losses):
        raise ValueError("batch_sizes and losses must have the same length")
    if len(batch_sizes) < 2 or len(set(batch_sizes)) != len(batch_sizes):
        raise ValueError("need at least 2 distinct batch sizes")
    for b in batch_sizes:
        check_positive("batch size", b)
    order = sorted(range(len(batch_sizes)), key=lambda i: batch_sizes[i])
    xs = [float(batch_sizes[i]) for i in order]
    rows = [[float(v) for v in losses[i]] for i in order]
    if any(not row for row in rows):
        raise ValueError("every batch size needs at least one loss")
    if any(not math.isfinite(v) for v in rows[0]):
        raise ValueError("the smallest batch's losses must be finite (it is the reference)")
    # The reading is invariant under scaling every loss: read it on losses scaled to the
    # reference's magnitude, report the losses back at their own.
    scale = _scale_of(rows[0])
    rows = [[v / scale for v in r] for r in rows]
    means = [branch_mean_loss(r) for r in rows]
    seeds = min(len(r) for r in rows)
    paired = all(len(r) == len(rows[0]) for r in rows)

    def se(values: list[float]) -> float | None:
        if len(values) < 2 or any(not math.isfinite(v) for v in values):
            return None
        m = sum(values) / len(values)
        return math.sqrt(sum((v - m) * (v - m) for v in values) / (len(values) - 1) / len(values))

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
            ses.append(math.hypot(se_r, (1.0 + epsilon) * se_0) if both else None)  # type: ignore[arg-type,operator]
    value = _first_crossing(xs, ds)

    def result(
        b: float | None,
        lo: float | None,
        hi: float | None,
        reason: str | None,
        interpolated: float | None = None,
    ) -> LocalCriticalBatch:
        return LocalCriticalBatch(
            b,
            lo,
            hi,
            level,
            epsilon,
            threshold * scale,
            tuple(xs),
            tuple(m * scale for m in means),
            tuple(None if x is None else x * scale for x in ses),
            seeds,
            reason,
            interpolated,
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
    if means[0] <= 0:  # a relative tolerance means nothing around a loss <= 0
        return result(
            None,
            None,
            xs[0],
            "the smallest batch is already outside the tolerance (its loss "
            f"{means[0] * scale:g} is not positive): a relative tolerance needs a positive loss",
        )
    # The crossing's cell [xs[cell], xs[cell + 1]] and D's jumps, in units of eps L(b_0), across
    # it and across the grid step before it.
    cell = next(i for i in range(1, len(xs)) if ds[i] > 0) - 1
    tolerance = epsilon * means[0] or math.ulp(0.0)  # > 0: means[0] > 0 here
    jump = (ds[cell + 1] - ds[cell]) / tolerance
    before = (ds[cell] - ds[cell - 1]) / tolerance if cell > 0 else 0.0
    resolved = cell > 0 and jump <= MAX_RESOLVED_JUMP * max(before, 1.0)
    cell_lo, cell_hi = xs[cell], xs[cell + 1]
    lo: float | None = cell_lo
    hi: float | None = cell_hi
    notes: list[str] = []
    if seeds < 2:
        notes.append("one seed per batch size: no interval from the seeds (run 2 or more seeds)")
        if resolved:
            return result(value, None, None, notes[0], value)
    else:
        t = student_t_quantile(0.5 + level / 2.0, seeds - 1)
        # A diverged batch (infinite D, no standard error) is outside at any confidence.
        spread = [t * (x or 0.0) for x in ses]
        seeds_lo = _first_crossing(xs, [d + w for d, w in zip(ds, spread, strict=True)])
        seeds_hi = _first_crossing(xs, [d - w for d, w in zip(ds, spread, strict=True)])
        lo = cell_lo if seeds_lo is None else min(seeds_lo, cell_lo)
        hi = None if seeds_hi is None else max(seeds_hi, cell_hi)
        if hi is None:
            notes.append(
                f"the upper end is above the largest batch tried ({xs[-1]:g}) at {level:.0%} "
                "confidence: more seeds or larger multipliers narrow it"
            )
    if resolved:
        return result(value, lo, hi, "; ".join(notes) or None, value)
    jump_text = "a diverged branch" if math.isinf(jump) else f"a rise of {jump:.3g} ε"
    if cell == 0:
        why = (
            f"the first step of the grid (x{cell_hi / cell_lo:g}) already leaves the tolerance "
            f"({jump_text}): branch from a smaller base batch or with finer multipliers"
        )
    else:
        why = (
            f"the loss jumps across that step of the grid ({jump_text}, more than "
            f"{MAX_RESOLVED_JUMP:g}x the step before), which does not resolve the crossing: "
            f"branch with finer multipliers between {cell_lo:g} and {cell_hi:g}"
        )
    where = f"between {lo:g} and {hi:g}" if hi is not None else f"at least {lo:g}"
    return result(None, lo, hi, "; ".join([f"{where}: {why}", *notes]), value)
