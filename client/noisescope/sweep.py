"""The critical batch size of a task from its batch-size sweep: the one analysis of it.

McCandlish et al. (2018, Sec. 2.2-3; docs/science.md) define B_crit through the steps S and
examples E a run needs to reach a loss target *with its learning rate tuned*: across batch
sizes, S = S_min (1 + B_crit/B). A sweep usually holds several learning rates (and seeds) per
batch size, and only the fastest learning rate at each batch size belongs on that curve. So,
per loss target:

1. each run's crossing: the first step where its loss curve reaches the target, interpolated
   linearly between points (``crossing_step``). The curve is the run's evaluation loss when
   the task's runs logged one, else its training loss averaged over a centred window of
   steps ``(1 ± LOSS_WINDOW) s`` (``smooth_training_loss``): a single noisy minibatch never
   counts as reaching a target.
2. the frontier (``frontier``): per batch size, the learning rate whose runs reached the target
   in the fewest steps, the median over its seeds (a seed that never got there counts as
   infinitely slow).
3. the fit of S = S_min (1 + B_crit/B) through the frontier (``estimators.fit_critical_batch``:
   weighted least squares, Fieller interval), and warnings instead of a confident number when
   fewer than ``MIN_BATCH_SIZES`` batch sizes reach the target, S_min or E_min is not
   positive, the interval is unbounded, or B_crit falls outside the batch sizes tried.
4. B_simple at the same loss from the same runs (``b_simple_at_loss``): the frontier runs' noise
   samples over steps ``[s*/B_SIMPLE_WINDOW, s* * B_SIMPLE_WINDOW]`` around each one's crossing
   s*, pooled as sums (ratio last) with the block interval of ``estimators``.

Default targets (``default_targets``) are spread between where the runs start and the best
loss that *every* batch size reaches, so every target can be fitted. Everything is pure
Python: the server runs it on stored data (``GET /api/v1/tasks/{project}/{task}/critical-batch``)
and the reproduction study on its own records, so both give the same numbers.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from noisescope._format import count as _fmt
from noisescope.estimators import (
    CriticalBatchFit,
    examples_ratio,
    fit_critical_batch,
    interval_from_blocks,
    reblock,
    steps_ratio,
)

__all__ = [
    "B_SIMPLE_WINDOW",
    "DEFAULT_TARGET_FRACTIONS",
    "LOSS_WINDOW",
    "MIN_BATCH_SIZES",
    "CriticalBatchReport",
    "CurvePoint",
    "ExcludedRun",
    "FrontierPoint",
    "LossSource",
    "NoiseBucket",
    "RunAtTarget",
    "SweepRun",
    "TargetResult",
    "analyse",
    "b_simple_at_loss",
    "crossing_step",
    "default_targets",
    "frontier",
    "smooth_training_loss",
]

#: The training loss at step s is its mean over steps (1 - LOSS_WINDOW) s .. (1 + LOSS_WINDOW) s
#: (0.2: on the project's quick sweeps, crossings of the smoothed training loss fall within a
#: few per cent of the evaluation loss's on average, where 0.1 crosses ~25% early on small
#: batches: the first dip of a noisy curve below a target comes early).
LOSS_WINDOW = 0.2
#: B_simple "at a loss" pools the noise samples over steps s*/B_SIMPLE_WINDOW .. s* B_SIMPLE_WINDOW.
B_SIMPLE_WINDOW = 1.25
#: Default targets sit at these fractions of the way from the hardest common loss to the start.
DEFAULT_TARGET_FRACTIONS = (0.5, 0.3, 0.15, 0.05)
#: Fewest distinct batch sizes that must reach a target for a fit.
MIN_BATCH_SIZES = 3

LossSource = Literal["eval", "train"]


# --- inputs ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class NoiseBucket:
    """Exact sums of the per-sample estimates |𝒢|^2 and 𝒮 over a run's steps lo..hi."""

    step_lo: float
    step_hi: float
    n: float
    sum_g_sq: float
    sum_trace_sigma: float


@dataclass(frozen=True)
class SweepRun:
    """One run of a sweep: its batch size (task units per step), learning rate, loss curve.

    ``steps``/``losses`` is the curve targets are crossed on (evaluations, or a smoothed
    training loss), steps increasing. Runs with the same batch size and ``lr`` are seeds.
    """

    uid: str
    name: str
    batch_size: float
    lr: float | None
    steps: Sequence[float]
    losses: Sequence[float]
    noise: Sequence[NoiseBucket] = ()
    status: str = "finished"


# --- outputs ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunAtTarget:
    """Where one run reached a target (``steps`` None: not reached); ``frontier`` marks the runs
    the fit used."""

    uid: str
    name: str
    batch_size: float
    lr: float | None
    steps: float | None
    examples: float | None
    frontier: bool


@dataclass(frozen=True)
class FrontierPoint:
    """The fastest learning rate at one batch size: median steps over its ``run_uids``."""

    batch_size: float
    lr: float | None
    steps: float
    examples: float
    run_uids: list[str]


@dataclass(frozen=True)
class CurvePoint:
    """A point of the fitted S-E hyperbola: S = S_min (1 + B_crit/B), E = E_min (1 + B/B_crit)."""

    batch_size: float
    steps: float
    examples: float


@dataclass(frozen=True)
class TargetResult:
    """One loss target: the frontier, the fit and B_simple at that loss.

    ``determined`` is True only when B_crit has a bounded interval that excludes 0 and lies
    inside the batch sizes tried; otherwise ``warnings`` say why and ``b_crit`` (if any) is not
    to be trusted.
    """

    target: float
    points: list[FrontierPoint]
    runs: list[RunAtTarget]
    s_min: float | None
    e_min: float | None
    b_crit: float | None
    b_crit_lo: float | None
    b_crit_hi: float | None
    determined: bool
    warnings: list[str]
    b_simple: float | None
    b_simple_lo: float | None
    b_simple_hi: float | None
    b_simple_reason: str | None
    #: The fitted hyperbola from a quarter of the smallest to 4x the largest batch (for charts).
    curve: list[CurvePoint] = field(default_factory=list)


@dataclass(frozen=True)
class ExcludedRun:
    uid: str
    name: str
    reason: str


@dataclass(frozen=True)
class CriticalBatchReport:
    """The critical batch size of one task, per loss target, and how it was made."""

    project: str
    task: str
    units: str
    level: float
    loss_source: LossSource
    #: How targets are crossed, in words (which loss, which smoothing).
    loss_method: str
    #: True when the targets were chosen by ``default_targets`` (none were asked for).
    default_targets: bool
    batch_sizes: list[float]
    n_runs: int
    excluded: list[ExcludedRun]
    warnings: list[str]
    targets: list[TargetResult] = field(default_factory=list)


# --- step 1: crossings ---------------------------------------------------------------------


def crossing_step(steps: Sequence[float], losses: Sequence[float], target: float) -> float | None:
    """First step where ``losses`` reaches ``target`` (≤), interpolated linearly; None if never.

    A curve that starts at or below the target gives its first step (there is nothing to
    interpolate from); ``losses`` should already be smooth.
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


def smooth_training_loss(
    steps: Sequence[float], losses: Sequence[float], weights: Sequence[float] | None = None
) -> list[float]:
    """Each point's loss averaged (weighted) over the points within steps (1 ± LOSS_WINDOW) s:
    centred, so a falling loss is not lagged (at the ends of the run the window shrinks to stay
    symmetric about s), and of the same relative width for runs whose lengths differ by orders
    of magnitude. The first dip of a noisy curve below a target comes early, most of all for
    small batches: the window is what keeps a crossing honest."""
    if len(steps) != len(losses) or (weights is not None and len(weights) != len(steps)):
        raise ValueError("steps, losses and weights must have the same length")
    if not steps:
        return []
    w = [1.0] * len(steps) if weights is None else [float(x) for x in weights]
    prefix_w = [0.0]
    prefix_wl = [0.0]
    for wi, li in zip(w, losses, strict=True):
        prefix_w.append(prefix_w[-1] + wi)
        prefix_wl.append(prefix_wl[-1] + wi * li)
    first, last = float(steps[0]), float(steps[-1])
    out = []
    for s in steps:
        lo_step, hi_step = s * (1.0 - LOSS_WINDOW), s * (1.0 + LOSS_WINDOW)
        if hi_step > last:
            lo_step = max(lo_step, s - (last - s))
        if lo_step < first:
            hi_step = min(hi_step, s + (s - first))
        lo = bisect.bisect_left(steps, lo_step)
        hi = bisect.bisect_right(steps, hi_step)
        total = prefix_w[hi] - prefix_w[lo]
        out.append((prefix_wl[hi] - prefix_wl[lo]) / total if total > 0 else float("nan"))
    return out


# --- step 2: the frontier --------------------------------------------------------------------


def _lr_key(run: SweepRun) -> object:
    return run.uid if run.lr is None else float(f"{run.lr:.6g}")


def frontier(
    runs: Sequence[SweepRun], target: float
) -> tuple[list[FrontierPoint], dict[str, float | None]]:
    """Per batch size, the learning rate that reached ``target`` in the fewest (median) steps.

    Runs sharing a batch size and learning rate are seeds: their median crossing step counts,
    a seed that never reached the target counting as infinitely slow. Also returns every run's
    own crossing step (None: not reached; 0 or less: started below the target).
    """
    crossing = {r.uid: crossing_step(r.steps, r.losses, target) for r in runs}
    groups: dict[tuple[float, object], list[SweepRun]] = {}
    for run in runs:
        groups.setdefault((run.batch_size, _lr_key(run)), []).append(run)
    best: dict[float, FrontierPoint] = {}
    for (batch_size, _), group in groups.items():
        values = [crossing[r.uid] for r in group]
        median = statistics.median(math.inf if v is None else v for v in values)
        if not math.isfinite(median):
            continue
        current = best.get(batch_size)
        if current is None or median < current.steps:
            best[batch_size] = FrontierPoint(
                batch_size, group[0].lr, median, median * batch_size, [r.uid for r in group]
            )
    return [best[b] for b in sorted(best)], crossing


# --- step 4: B_simple at a loss ------------------------------------------------------------


def b_simple_at_loss(
    runs: Sequence[SweepRun], crossings: dict[str, float | None], *, level: float = 0.9
) -> tuple[float | None, float | None, float | None, str | None]:
    """B_simple (value, lo, hi, reason) pooled over the runs' noise buckets in the step window
    [s*/B_SIMPLE_WINDOW, s* B_SIMPLE_WINDOW] around each run's own crossing s*.

    A bucket counts when its middle step lies in the window; where none does (coarse buckets),
    the bucket holding s* counts. Sums are pooled before the ratio (docs/science.md). For the
    interval each run's window is merged into at most ``BLOCKS_PER_RUN`` contiguous blocks of
    its own, so blocks never straddle two runs and the answer does not depend on their order.
    """
    block_n: list[float] = []
    block_g: list[float] = []
    block_s: list[float] = []
    for run in runs:
        s_star = crossings.get(run.uid)
        if s_star is None or not run.noise:
            continue
        lo, hi = s_star / B_SIMPLE_WINDOW, s_star * B_SIMPLE_WINDOW
        chosen = [b for b in run.noise if lo <= (b.step_lo + b.step_hi) / 2 <= hi]
        if not chosen:
            chosen = [b for b in run.noise if b.step_lo <= s_star <= b.step_hi][:1]
        n, g, s = reblock(
            [b.n for b in chosen],
            [b.sum_g_sq for b in chosen],
            [b.sum_trace_sigma for b in chosen],
            BLOCKS_PER_RUN,
        )
        block_n += n
        block_g += g
        block_s += s
    if not block_n:
        return None, None, None, "no noise samples near this loss in the frontier runs"
    interval = interval_from_blocks(block_n, block_g, block_s, level=level, max_blocks=len(block_n))
    if interval.b_simple is None:
        return None, None, None, interval.reason
    return interval.b_simple.value, interval.b_simple.lo, interval.b_simple.hi, None


#: Blocks each run's window contributes to the interval of B_simple at a loss.
BLOCKS_PER_RUN = 8


# --- targets -------------------------------------------------------------------------------


def _round_near(value: float, tolerance: float) -> float:
    """``value`` with the fewest significant digits that stay within ``tolerance`` of it."""
    for digits in range(2, 16):
        rounded = float(f"{value:.{digits}g}")
        if abs(rounded - value) <= tolerance:
            return rounded
    return value


def default_targets(runs: Sequence[SweepRun]) -> tuple[list[float], list[str]]:
    """Loss targets every batch size reaches, and warnings about batch sizes left out.

    The hardest target is just above the worst batch size's best loss (each batch size's best
    run), the easiest halfway down from where the runs start (their lowest first point), at
    ``DEFAULT_TARGET_FRACTIONS`` of that range.
    """
    curves = [(r, [x for x in r.losses if math.isfinite(x)]) for r in runs]
    curves = [(r, c) for r, c in curves if c]
    if not curves:
        return [], ["no run has a loss curve: log `loss=` (or `eval_loss=`) to fit B_crit"]
    start = min(c[0] for _, c in curves)
    best: dict[float, float] = {}
    for r, c in curves:
        best[r.batch_size] = min(best.get(r.batch_size, math.inf), min(c))
    warnings = []
    stalled = sorted(b for b, v in best.items() if not v < start)
    if stalled:
        warnings.append(
            "no run at batch size "
            + ", ".join(_fmt(b) for b in stalled)
            + " got below the loss the runs start from; default targets leave it out"
        )
    reached = [v for b, v in best.items() if v < start]
    if not reached:
        return [], [*warnings, "no run's loss falls: there is no target to fit"]
    hardest = max(reached)
    span = start - hardest
    targets = [_round_near(hardest + span * f, 0.02 * span) for f in DEFAULT_TARGET_FRACTIONS]
    return sorted(set(targets), reverse=True), warnings


# --- the whole analysis ----------------------------------------------------------------------


def _target_result(runs: Sequence[SweepRun], target: float, level: float) -> TargetResult:
    points, crossing = frontier(runs, target)
    on_frontier = {uid for p in points for uid in p.run_uids}
    per_run = []
    for r in runs:
        s = crossing[r.uid]
        examples = None if s is None else s * r.batch_size
        per_run.append(
            RunAtTarget(r.uid, r.name, r.batch_size, r.lr, s, examples, r.uid in on_frontier)
        )
    warnings: list[str] = []
    first_step = {r.uid: float(r.steps[0]) for r in runs if len(r.steps)}
    early = [p for p in points if p.steps <= min(first_step[u] for u in p.run_uids)]
    if early:
        points = [p for p in points if p not in early]
        warnings.append(
            f"at batch size {', '.join(_fmt(p.batch_size) for p in early)} the runs start at or "
            f"below loss {target:g}, so the steps to reach it are not measured (pick a lower "
            "target)"
        )
    b_simple = b_simple_at_loss([r for r in runs if r.uid in on_frontier], crossing, level=level)
    sizes = [p.batch_size for p in points]
    fit = None
    if len(sizes) < MIN_BATCH_SIZES:
        missing = [b for b in sorted({r.batch_size for r in runs}) if b not in sizes]
        warnings.append(
            f"reached by {len(sizes)} batch size(s)"
            + (f" ({', '.join(_fmt(b) for b in sizes)})" if sizes else "")
            + f"; a fit needs at least {MIN_BATCH_SIZES}"
            + (f" (not reached at {', '.join(_fmt(b) for b in missing)})" if missing else "")
            + ": pick a target more batch sizes reach, or run more batch sizes"
        )
    else:
        fit = fit_critical_batch(sizes, [p.steps for p in points], level=level)
        if fit.reason is not None:
            warnings.append(fit.reason)
    determined = fit is not None and fit.b_crit is not None and fit.b_crit_lo is not None
    if determined and fit is not None and fit.b_crit_lo == 0.0 and fit.b_crit_hi is not None:
        determined = False
        warnings.append(
            f"the {level:.0%} interval reaches 0: the steps are not shown to fall as the batch "
            f"grows, so B_crit is below {_fmt(fit.b_crit_hi)} but not pinned down (run smaller "
            "batch sizes, or more seeds)"
        )
    if fit is not None and fit.b_crit is not None and not sizes[0] <= fit.b_crit <= sizes[-1]:
        determined = False
        warnings.append(
            f"the fit puts B_crit at {_fmt(fit.b_crit)}, outside the batch sizes that reached "
            f"this loss ({_fmt(sizes[0])} to {_fmt(sizes[-1])}): an extrapolation; run batch "
            "sizes on both sides of it"
        )
    elif (
        determined
        and fit is not None
        and fit.b_crit_lo is not None
        and fit.b_crit_hi is not None
        and (fit.b_crit_lo < sizes[0] or fit.b_crit_hi > sizes[-1])
    ):
        warnings.append(
            f"the {level:.0%} interval ({_fmt(fit.b_crit_lo)} to {_fmt(fit.b_crit_hi)}) "
            "reaches beyond the batch sizes tried"
        )
    return TargetResult(
        target=target,
        points=points,
        runs=per_run,
        s_min=None if fit is None else fit.s_min,
        e_min=None if fit is None else fit.e_min,
        b_crit=None if fit is None else fit.b_crit,
        b_crit_lo=None if fit is None else fit.b_crit_lo,
        b_crit_hi=None if fit is None else fit.b_crit_hi,
        determined=determined,
        warnings=warnings,
        b_simple=b_simple[0],
        b_simple_lo=b_simple[1],
        b_simple_hi=b_simple[2],
        b_simple_reason=b_simple[3],
        curve=_curve(fit, sizes),
    )


#: Points along a drawn S-E hyperbola.
CURVE_POINTS = 60


def _curve(fit: CriticalBatchFit | None, sizes: Sequence[float]) -> list[CurvePoint]:
    if fit is None or fit.b_crit is None or not sizes:
        return []
    lo, hi = sizes[0] / 4.0, sizes[-1] * 4.0
    out = []
    for i in range(CURVE_POINTS):
        b = lo * (hi / lo) ** (i / (CURVE_POINTS - 1))
        out.append(
            CurvePoint(
                b, fit.s_min * steps_ratio(b, fit.b_crit), fit.e_min * examples_ratio(b, fit.b_crit)
            )
        )
    return out


def analyse(
    runs: Sequence[SweepRun],
    targets: Sequence[float] | None = None,
    *,
    project: str = "",
    task: str = "",
    units: str = "examples",
    loss_source: LossSource = "train",
    excluded: Sequence[ExcludedRun] = (),
    warnings: Sequence[str] = (),
    level: float = 0.9,
) -> CriticalBatchReport:
    """The critical batch size per loss target (``default_targets`` when none are given)."""
    notes = list(warnings)
    chosen = [float(t) for t in targets] if targets else []
    if not chosen:
        chosen, target_notes = default_targets(runs)
        notes += target_notes
    sizes = sorted({r.batch_size for r in runs})
    if len(sizes) < MIN_BATCH_SIZES:
        notes.append(
            f"the task has runs at {len(sizes)} batch size(s); a critical batch size needs "
            f"runs at {MIN_BATCH_SIZES} or more (e.g. 4 sizes spanning 16x, each with its "
            "learning rate tuned)"
        )
    running = sum(r.status == "running" for r in runs)
    if running:
        notes.append(f"{running} of {len(runs)} runs are still running: the answer may change")
    method = (
        "evaluation loss, crossings interpolated between evaluations"
        if loss_source == "eval"
        else f"training loss averaged over steps {1 - LOSS_WINDOW:g}·s to {1 + LOSS_WINDOW:g}·s "
        "(symmetric about s at the ends of a run), crossings interpolated between points"
    )
    return CriticalBatchReport(
        project=project,
        task=task,
        units=units,
        level=level,
        loss_source=loss_source,
        loss_method=method,
        default_targets=not targets,
        batch_sizes=sizes,
        n_runs=len(runs),
        excluded=list(excluded),
        warnings=notes,
        targets=[_target_result(runs, t, level) for t in chosen],
    )
