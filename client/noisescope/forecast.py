"""The critical batch size as a function of loss, and when the local one stops growing.

Kaplan et al. (2020) fit B_crit(L) = B* L^(-1/α_B) across loss targets (docs/science.md, "The
critical batch size as a function of loss"). It is a line in logs, log B_crit = log B* - (1/α_B)
log L, fitted here by weighted least squares like ``estimators.fit_critical_batch``: each
measurement weighs by the inverse square of its interval's half-width in log B (the narrow ones
count most; a measurement without an interval gets the median weight), the residual variance is
estimated on n - 2 degrees of freedom, and Student-t quantiles give the intervals, on 1/α_B and
on the prediction at any loss. A prediction at a loss outside the fitted ones is marked as an
extrapolation.

The targets of one sweep are not independent points: every target is read off the same runs,
so a run that is slow at one loss is slow at all of them, and the targets' errors move
together. The residual scatter about the line then says nothing about how far the whole line
may be off, and the least-squares interval alone came out many times narrower than the
targets' own (±0.4% between targets measured to ±30% on a synthetic sweep whose seeds share
their speed across losses; it missed the truth in 40 of 40 sweeps). So a prediction's interval
is never narrower than the measurements': at a loss between two fitted targets, its relative
half-widths below and above (in log B) are at least those of the targets around it,
interpolated in log L; beyond the fitted losses, those of the nearest target (the fit's own
interval widens there anyway). docs/science.md states the rule.

``plateau`` reads the branch measurements of one run (``noisescope.branch``) over its steps: the
local critical batch size rises fast early and then plateaus (Merrill et al. 2025).
"""

from __future__ import annotations

import itertools
import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from noisescope.estimators import (
    LineFit,
    check_level,
    check_positive,
    student_t_quantile,
    weighted_line_fit,
)

__all__ = [
    "CriticalBatchForecast",
    "CriticalBatchLaw",
    "ForecastPoint",
    "ForecastReport",
    "Plateau",
    "fit_critical_batch_law",
    "forecast_report",
    "law_from_report",
    "plateau",
]


#: The logs of the largest float and of the smallest normal one (a prediction between them is
#: a float with full precision), and of the smallest positive float.
_LOG_MAX = math.log(sys.float_info.max)
_LOG_MIN = math.log(sys.float_info.min)
_TINY = math.ulp(0.0)
_LOG_TINY = math.log(_TINY)


@dataclass(frozen=True)
class CriticalBatchForecast:
    """B_crit predicted at ``loss`` with its ``level`` interval; ``extrapolation`` when the loss
    lies outside the fitted losses (the interval then assumes the law holds out there too)."""

    loss: float
    b_crit: float
    b_crit_lo: float
    b_crit_hi: float
    level: float
    extrapolation: bool


@dataclass(frozen=True)
class CriticalBatchLaw:
    """B_crit(L) = B* L^(-1/α_B) fitted to ``n_points`` (loss, B_crit) measurements.

    ``b_star`` is B_crit at L = 1 (the loss's own units: nats for cross-entropy). ``alpha_b`` is
    None (with ``reason``) when B_crit does not grow as the loss falls; ``alpha_b_lo/hi`` are
    None when 1/α_B's interval reaches zero (the growth is not significant).
    """

    b_star: float | None
    alpha_b: float | None
    alpha_b_lo: float | None
    alpha_b_hi: float | None
    level: float
    n_points: int
    loss_min: float
    loss_max: float
    #: The fit, for predictions: log B_crit = line.intercept + line.slope log L.
    line: LineFit
    reason: str | None = None
    #: The fitted measurements' (log L, half-width below, half-width above) in log B, by log L:
    #: the floor under every prediction's interval (the module docstring).
    widths: tuple[tuple[float, float, float], ...] = ()

    def _floor(self, x0: float) -> tuple[float, float]:
        """The measurements' half-widths (below, above) in log B at log L = ``x0``, linear in
        log L between fitted losses, the nearest one's beyond them; (0, 0) without any."""
        w = self.widths
        if not w:
            return 0.0, 0.0
        if x0 <= w[0][0]:
            return w[0][1], w[0][2]
        for (xa, la, ha), (xb, lb, hb) in itertools.pairwise(w):
            if x0 <= xb:
                f = (x0 - xa) / (xb - xa)
                return la + f * (lb - la), ha + f * (hb - ha)
        return w[-1][1], w[-1][2]

    def predict(self, loss: float) -> CriticalBatchForecast:
        """B_crit at ``loss`` (must be positive and finite), with the fit's interval.

        ValueError naming the losses the law can be read at when B_crit or its interval at
        ``loss`` lies beyond the floating-point range (far outside the fitted losses)."""
        check_positive("loss", loss)
        x0 = math.log(loss)
        y0 = self.line.intercept + self.line.slope * x0
        se = math.sqrt(self.line.var_mean(x0))
        t = student_t_quantile(0.5 + self.level / 2.0, self.n_points - 2)
        below, above = self._floor(x0)
        y_lo, y_hi = y0 - max(t * se, below), y0 + max(t * se, above)
        if not _LOG_MIN <= y_lo <= y_hi <= _LOG_MAX:
            lo, hi = self._readable_losses()
            raise ValueError(
                f"loss {loss:g} lies too far from the fitted losses ({self.loss_min:g} to "
                f"{self.loss_max:g}) to forecast: B_crit or its interval there is beyond the "
                f"floating-point range; the law can be read at losses from about {lo:.3g} to "
                f"{hi:.3g}"
            )
        outside = not (self.loss_min <= loss <= self.loss_max)
        return CriticalBatchForecast(
            loss, math.exp(y0), math.exp(y_lo), math.exp(y_hi), self.level, outside
        )

    def _readable_losses(self) -> tuple[float, float]:
        """The losses whose predicted B_crit (without its interval) is a float, clamped to the
        positive floats."""
        icept, slope = self.line.intercept, self.line.slope
        if slope == 0:
            return _TINY, sys.float_info.max
        ends = sorted((y - icept) / slope for y in (_LOG_MIN, _LOG_MAX))
        return math.exp(max(ends[0], _LOG_TINY)), math.exp(min(ends[1], _LOG_MAX))


def fit_critical_batch_law(
    losses: Sequence[float],
    b_crits: Sequence[float],
    b_crit_lo: Sequence[float | None] | None = None,
    b_crit_hi: Sequence[float | None] | None = None,
    *,
    level: float = 0.9,
) -> CriticalBatchLaw:
    """Fit log B_crit = log B* + k log L (k = -1/α_B) to measurements at >= 3 distinct losses."""
    check_level(level)
    n = len(losses)
    if len(b_crits) != n:
        raise ValueError("losses and b_crits must have the same length")
    lows = list(b_crit_lo) if b_crit_lo is not None else [None] * n
    highs = list(b_crit_hi) if b_crit_hi is not None else [None] * n
    if len(lows) != n or len(highs) != n:
        raise ValueError("b_crit_lo and b_crit_hi must have one entry per loss")
    for loss in losses:
        check_positive("loss", loss)
    for b_crit in b_crits:
        check_positive("critical batch size", b_crit)
    if len(set(losses)) < 3:
        raise ValueError(f"need measurements at 3 or more distinct losses, got {len(set(losses))}")
    xs = [math.log(v) for v in losses]
    ys = [math.log(v) for v in b_crits]
    z = student_t_quantile(0.5 + level / 2.0, 1e6)
    half = [
        (math.log(h) - math.log(lo)) / (2.0 * z)
        if lo is not None and h is not None and 0 < lo < h and math.isfinite(h)
        else None
        for lo, h in zip(lows, highs, strict=True)
    ]
    known = [1.0 / (h * h) for h in half if h is not None and h > 0]
    fallback = statistics.median(known) if known else 1.0
    ws = [1.0 / (h * h) if h is not None and h > 0 else fallback for h in half]
    line = weighted_line_fit(xs, ys, ws)
    icept, slope = line.intercept, line.slope
    t = student_t_quantile(0.5 + level / 2.0, n - 2)
    se_slope = math.sqrt(line.var_slope)
    common = (level, n, min(losses), max(losses), line)
    widths = _widths(xs, ys, lows, highs)
    if slope >= 0:
        return CriticalBatchLaw(
            math.exp(icept),
            None,
            None,
            None,
            *common,
            reason=f"B_crit does not grow as the loss falls (fitted exponent {slope:.3g} >= 0): "
            "no power law B* L^(-1/alpha_B) to forecast with",
            widths=widths,
        )
    alpha = -1.0 / slope
    k_lo, k_hi = slope - t * se_slope, slope + t * se_slope
    reason = None
    if k_hi >= 0:
        a_lo, a_hi = None, None
        reason = (
            f"1/alpha_B is not significantly above zero at {level:.0%} confidence "
            f"({n} losses): measure B_crit at more losses, further apart"
        )
    else:
        a_lo, a_hi = -1.0 / k_lo, -1.0 / k_hi
    return CriticalBatchLaw(
        math.exp(icept), alpha, a_lo, a_hi, *common, reason=reason, widths=widths
    )


def _widths(
    xs: Sequence[float],
    ys: Sequence[float],
    lows: Sequence[float | None],
    highs: Sequence[float | None],
) -> tuple[tuple[float, float, float], ...]:
    """Each measurement's (log L, half-width below, half-width above) in log B, sorted by log L
    and averaged over measurements at one loss; those without both ends are left out (their
    weight in the fit is the median's, their width unknown)."""
    by_x: dict[float, list[tuple[float, float]]] = {}
    for x, y, lo, hi in zip(xs, ys, lows, highs, strict=True):
        if lo is not None and hi is not None and 0 < lo <= math.exp(y) <= hi < math.inf:
            by_x.setdefault(x, []).append((y - math.log(lo), math.log(hi) - y))
    return tuple(
        (x, sum(b for b, _ in v) / len(v), sum(a for _, a in v) / len(v))
        for x, v in sorted(by_x.items())
    )


def law_from_report(report: object, *, level: float | None = None) -> CriticalBatchLaw | None:
    """The law across a sweep's determined targets (``sweep.CriticalBatchReport``); None when
    fewer than 3 targets have a determined B_crit."""
    targets = [
        t
        for t in getattr(report, "targets", [])
        if t.determined and t.b_crit is not None and t.target > 0
    ]
    if len({t.target for t in targets}) < 3:
        return None
    return fit_critical_batch_law(
        [t.target for t in targets],
        [t.b_crit for t in targets],
        [t.b_crit_lo for t in targets],
        [t.b_crit_hi for t in targets],
        level=level if level is not None else float(getattr(report, "level", 0.9)),
    )


@dataclass(frozen=True)
class ForecastPoint:
    """A sweep target the law was fitted to: its loss and B_crit with interval."""

    loss: float
    b_crit: float
    b_crit_lo: float | None
    b_crit_hi: float | None


@dataclass(frozen=True)
class ForecastReport:
    """The law across a task's sweep targets and its predictions (the forecast endpoint).

    The law's fields are None (with ``reason``) when fewer than 3 targets have a determined
    B_crit; ``predictions`` is then empty.
    """

    project: str
    task: str
    units: str
    level: float
    b_star: float | None
    alpha_b: float | None
    alpha_b_lo: float | None
    alpha_b_hi: float | None
    n_points: int
    loss_min: float | None
    loss_max: float | None
    reason: str | None
    points: list[ForecastPoint]
    predictions: list[CriticalBatchForecast]


def forecast_report(report: Any, losses: Sequence[float] = ()) -> ForecastReport:
    """``law_from_report`` for a ``sweep.CriticalBatchReport``, predicted at ``losses``
    (each checked, whether or not there is a law to read them on)."""
    for loss in losses:
        check_positive("loss", loss)
    used = [
        ForecastPoint(t.target, t.b_crit, t.b_crit_lo, t.b_crit_hi)
        for t in report.targets
        if t.determined and t.b_crit is not None and t.target > 0
    ]
    law = law_from_report(report)
    head = (report.project, report.task, report.units, float(report.level))
    if law is None:
        return ForecastReport(
            *head,
            None,
            None,
            None,
            None,
            len(used),
            None,
            None,
            f"{len(used)} of the sweep's {len(report.targets)} loss targets have a determined "
            "B_crit; the law B_crit(L) = B* L^(-1/alpha_B) needs 3 or more",
            used,
            [],
        )
    return ForecastReport(
        *head,
        law.b_star,
        law.alpha_b,
        law.alpha_b_lo,
        law.alpha_b_hi,
        law.n_points,
        law.loss_min,
        law.loss_max,
        law.reason,
        used,
        [law.predict(v) for v in losses],
    )


@dataclass(frozen=True)
class Plateau:
    """Where a run's local critical batch size stops growing: from ``step`` on, every later
    measurement's interval overlaps the one at ``step``. ``step`` is None (with ``reason``)
    while it is still rising or there are too few measurements. ``b_crit`` is the measurement
    at ``step``: None when that one is a bracket (``estimators.local_critical_batch``), whose
    ends are then ``b_crit_lo`` and ``b_crit_hi``."""

    step: int | None
    b_crit: float | None
    reason: str | None = None
    b_crit_lo: float | None = None
    b_crit_hi: float | None = None


def plateau(
    steps: Sequence[int],
    b_crits: Sequence[float | None],
    b_crit_lo: Sequence[float | None],
    b_crit_hi: Sequence[float | None],
) -> Plateau:
    """The earliest branch point from which the local critical batch no longer grows
    significantly. A missing upper end counts as unbounded, a missing lower end as 0; a
    bracket (``b_crits`` None) takes part by its ends."""
    n = len(steps)
    if not n == len(b_crits) == len(b_crit_lo) == len(b_crit_hi):
        raise ValueError("steps, b_crits, b_crit_lo and b_crit_hi must have the same length")
    if n < 3:
        return Plateau(None, None, f"a plateau needs 3 or more branch points, got {n}")
    order = sorted(range(n), key=lambda i: steps[i])
    lo = [b_crit_lo[i] if b_crit_lo[i] is not None else 0.0 for i in order]
    hi = [b_crit_hi[i] if b_crit_hi[i] is not None else math.inf for i in order]
    for k in range(n - 1):
        if all(lo[j] <= hi[k] and lo[k] <= hi[j] for j in range(k + 1, n)):  # type: ignore[operator]
            i = order[k]
            value = b_crits[i]
            return Plateau(
                int(steps[i]),
                None if value is None else float(value),
                None,
                b_crit_lo[i],
                b_crit_hi[i],
            )
    return Plateau(
        None,
        None,
        "still rising: the last branch point's interval lies above every earlier one's; "
        "branch again later in the run",
    )
