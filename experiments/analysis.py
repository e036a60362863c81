"""Critical batch size from a batch-size sweep, set against B_simple measured at the same loss.

Generic on purpose (no torch, no task knowledge): the dashboard's Critical-batch page can feed it
the loss curves and noise samples it reads from the server. The maths (two-batch estimator,
window ratio of sums, the S-E hyperbola fit) is ``noisescope.estimators``; this module only
decides *which* numbers go in:

- ``crossing_step``: the first step where a (smoothed) loss curve reaches a target, linearly
  interpolated between evaluations.
- ``best_per_batch``: per batch size, the run (learning rate) that reached the target in the
  fewest steps (science.md, "Critical batch size from batch-size sweeps": lr tuned per B).
- ``fit_target``: S_min, E_min, B_crit = E_min / S_min from those points
  (``estimators.fit_critical_batch``, S = S_min (1 + B_crit/B)).
- ``b_simple_at_loss``: B_simple over a window of steps around where a run reaches the loss,
  as the ratio of window sums of the unbiased |𝒢|² and 𝒮 (science.md, two-batch estimator).
- ``critical_batch_rows``: all of the above for a list of loss targets.

Batch sizes, examples and the b_small/b_big of noise samples must be in the same units
(examples, or tokens for language models).
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from noisescope.estimators import (
    CriticalBatchFit,
    NoiseScale,
    fit_critical_batch,
    two_batch_estimates,
)

__all__ = [
    "CriticalBatchRow",
    "LossCurve",
    "NoiseSamples",
    "SweepRun",
    "TargetFit",
    "TargetPoint",
    "b_simple_at_loss",
    "best_per_batch",
    "critical_batch_rows",
    "crossing_step",
    "ema",
    "fit_target",
    "noise_scale_curve",
    "window_noise_scale",
]


def ema(values: Sequence[float], beta: float) -> list[float]:
    """Debiased exponential moving average (Adam-style), for smoothing noisy training losses."""
    if not 0.0 <= beta < 1.0:
        raise ValueError(f"beta must be in [0, 1), got {beta}")
    out: list[float] = []
    avg = 0.0
    weight = 0.0
    for v in values:
        avg = beta * avg + (1.0 - beta) * v
        weight = beta * weight + (1.0 - beta)
        out.append(avg / weight)
    return out


def crossing_step(steps: Sequence[float], losses: Sequence[float], target: float) -> float | None:
    """First step where ``losses`` reaches ``target`` (≤), interpolated linearly; None if never.

    ``losses`` should already be smooth (held-out loss at fixed points, or an EMA).
    """
    if len(steps) != len(losses):
        raise ValueError("steps and losses must have the same length")
    prev_s: float | None = None
    prev_l: float | None = None
    for s, loss in zip(steps, losses, strict=True):
        if math.isfinite(loss) and loss <= target:
            if prev_s is None or prev_l is None or not math.isfinite(prev_l) or prev_l == loss:
                return float(s)
            frac = (prev_l - target) / (prev_l - loss)
            return float(prev_s + frac * (s - prev_s))
        prev_s, prev_l = float(s), float(loss)
    return None


@dataclass(frozen=True)
class LossCurve:
    """A run's loss at a set of steps (held-out evaluations, or a smoothed training loss)."""

    steps: Sequence[float]
    losses: Sequence[float]


@dataclass(frozen=True)
class NoiseSamples:
    """Column-wise two-batch samples of one run (the wire format's columns)."""

    step: Sequence[float]
    b_small: Sequence[float]
    b_big: Sequence[float]
    g_small_sq: Sequence[float]
    g_big_sq: Sequence[float]


@dataclass(frozen=True)
class SweepRun:
    """One run of a sweep. ``batch_size`` in the task's units (examples or tokens) per step."""

    run_id: str
    batch_size: float
    lr: float
    curve: LossCurve
    samples: NoiseSamples | None = None
    seed: int = 0


def window_noise_scale(samples: NoiseSamples, lo_step: float, hi_step: float) -> NoiseScale:
    """B_simple over samples with lo_step ≤ step ≤ hi_step: ratio of the window sums."""
    sum_g_sq = 0.0
    sum_trace_sigma = 0.0
    n = 0
    for i, s in enumerate(samples.step):
        if lo_step <= s <= hi_step:
            g_sq, trace_sigma = two_batch_estimates(
                samples.b_small[i], samples.b_big[i], samples.g_small_sq[i], samples.g_big_sq[i]
            )
            sum_g_sq += g_sq
            sum_trace_sigma += trace_sigma
            n += 1
    return NoiseScale.from_sums(sum_g_sq, sum_trace_sigma, n)


def b_simple_at_loss(
    runs: SweepRun | Sequence[SweepRun], target: float, window: float = 1.25
) -> NoiseScale | None:
    """B_simple in the step window [s*/window, s*·window] around each run's crossing step s*.

    Several runs (repeats) pool their window sums before the ratio is taken. None when no run
    reaches ``target`` or none has samples. A window in log-steps keeps the same relative
    width for runs of very different lengths.
    """
    group = [runs] if isinstance(runs, SweepRun) else list(runs)
    sum_g_sq = 0.0
    sum_trace_sigma = 0.0
    n = 0.0
    for run in group:
        if run.samples is None:
            continue
        s_star = crossing_step(run.curve.steps, run.curve.losses, target)
        if s_star is None:
            continue
        scale = window_noise_scale(run.samples, s_star / window, s_star * window)
        sum_g_sq += scale.g_sq * scale.n
        sum_trace_sigma += scale.trace_sigma * scale.n
        n += scale.n
    if n == 0:
        return None
    return NoiseScale.from_sums(sum_g_sq, sum_trace_sigma, n)


@dataclass(frozen=True)
class TargetPoint:
    """The fastest learning rate at one batch size for one loss target.

    ``steps`` is the mean over the seeds of that (batch size, lr); ``run_ids`` are those runs.
    """

    batch_size: float
    lr: float
    steps: float
    examples: float
    run_ids: tuple[str, ...]


def best_per_batch(runs: Sequence[SweepRun], target: float) -> list[TargetPoint]:
    """Per batch size, the learning rate that reached ``target`` in the fewest steps.

    Runs that share a batch size and lr are repeats (seeds): their crossing steps are averaged,
    and the pair counts only if every repeat reached the target.
    """
    groups: dict[tuple[float, float], list[SweepRun]] = {}
    for run in runs:
        groups.setdefault((run.batch_size, run.lr), []).append(run)
    best: dict[float, TargetPoint] = {}
    for (batch_size, lr), group in groups.items():
        crossings = [crossing_step(r.curve.steps, r.curve.losses, target) for r in group]
        if any(c is None for c in crossings):
            continue
        s = statistics.fmean(c for c in crossings if c is not None)
        current = best.get(batch_size)
        if current is None or s < current.steps:
            ids = tuple(r.run_id for r in group)
            best[batch_size] = TargetPoint(batch_size, lr, s, s * batch_size, ids)
    return [best[b] for b in sorted(best)]


@dataclass(frozen=True)
class TargetFit:
    """The S-E fit for one target, or the reason it could not be made."""

    fit: CriticalBatchFit | None
    error: str | None


def fit_target(points: Sequence[TargetPoint]) -> TargetFit:
    """S = S_min (1 + B_crit / B) through the best points (estimators.fit_critical_batch)."""
    try:
        fit = fit_critical_batch([p.batch_size for p in points], [p.steps for p in points])
    except ValueError as exc:
        return TargetFit(None, str(exc))
    return TargetFit(fit, None)


@dataclass(frozen=True)
class CriticalBatchRow:
    """One loss target: sweep points, the fit, and B_simple measured at that loss.

    ``b_simple`` is the median over the best runs (one per batch size) of each run's window
    estimate; ``b_simple_per_run`` keeps them all (batch size → estimate) for plots.
    """

    target: float
    points: list[TargetPoint]
    fit: CriticalBatchFit | None
    fit_error: str | None
    b_simple: float | None
    b_simple_per_run: dict[float, float] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        """B_simple / B_crit (1 means the noise scale predicts the critical batch exactly)."""
        if self.fit is None or self.b_simple is None:
            return None
        return self.b_simple / self.fit.b_crit


def critical_batch_rows(
    runs: Sequence[SweepRun], targets: Sequence[float], window: float = 1.25
) -> list[CriticalBatchRow]:
    """For each target: best run per batch size, the fit, and B_simple at that loss."""
    by_id = {r.run_id: r for r in runs}
    rows: list[CriticalBatchRow] = []
    for target in targets:
        points = best_per_batch(runs, target)
        fitted = fit_target(points)
        per_run: dict[float, float] = {}
        for p in points:
            scale = b_simple_at_loss([by_id[i] for i in p.run_ids], target, window)
            if scale is not None and scale.b_simple is not None:
                per_run[p.batch_size] = scale.b_simple
        b_simple = statistics.median(per_run.values()) if per_run else None
        rows.append(CriticalBatchRow(target, points, fitted.fit, fitted.error, b_simple, per_run))
    return rows


def noise_scale_curve(
    run: SweepRun, window: float = 1.25
) -> list[tuple[float, float, float | None]]:
    """(step, loss, B_simple) at each evaluation of a run, B_simple over [s/window, s·window].

    Prefix sums make this linear in the number of samples, so a dashboard can draw B_simple
    against loss for long runs.
    """
    if run.samples is None:
        return []
    sm = run.samples
    prefix_g = [0.0]
    prefix_t = [0.0]
    for i in range(len(sm.step)):
        g_sq, trace_sigma = two_batch_estimates(
            sm.b_small[i], sm.b_big[i], sm.g_small_sq[i], sm.g_big_sq[i]
        )
        prefix_g.append(prefix_g[-1] + g_sq)
        prefix_t.append(prefix_t[-1] + trace_sigma)
    steps = list(sm.step)
    out: list[tuple[float, float, float | None]] = []
    for s, loss in zip(run.curve.steps, run.curve.losses, strict=True):
        if s <= 0:
            continue
        lo = bisect.bisect_left(steps, s / window)
        hi = bisect.bisect_right(steps, s * window)
        scale = NoiseScale.from_sums(
            prefix_g[hi] - prefix_g[lo], prefix_t[hi] - prefix_t[lo], hi - lo
        )
        out.append((float(s), float(loss), scale.b_simple))
    return out
