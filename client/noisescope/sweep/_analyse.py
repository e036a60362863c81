"""The whole analysis of a sweep: default targets, then per target the frontier, the fit of
S = S_min (1 + B_crit/B) (step 3) with its warnings, and B_simple at the same loss."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from noisescope._format import count as _fmt
from noisescope._results import MIN_BATCH_SIZES as MIN_BATCH_SIZES
from noisescope.estimators import (
    LOSS_WINDOW,
    CriticalBatchFit,
    examples_ratio,
    fit_critical_batch,
    steps_ratio,
)

from ._checks import divergence, lr_grid_warnings, seed_warning
from ._frontier import b_simple_at_loss, frontier, lr_key
from ._report import (
    CriticalBatchReport,
    CurvePoint,
    ExcludedRun,
    LossSource,
    RunAtTarget,
    SweepRun,
    TargetResult,
)

#: Default targets sit at these fractions of the way from the hardest common loss to the start.
DEFAULT_TARGET_FRACTIONS = (0.5, 0.3, 0.15, 0.05)


def _round_near(value: float, tolerance: float) -> float:
    """``value`` with the fewest significant digits that stay within ``tolerance`` of it."""
    for digits in range(2, 16):
        rounded = float(f"{value:.{digits}g}")
        if abs(rounded - value) <= tolerance:
            return rounded
    return value


def _reachable_loss(run: SweepRun, loss_source: LossSource) -> float:
    """The lowest loss ``run``'s curve reaches (inf: none). On a smoothed training loss the
    points whose window the end of the run cuts short (``estimators.smooth_training_loss``: at
    the last point, the raw loss of one step) do not count: their dips are noise, not
    progress."""
    points = [(s, x) for s, x in zip(run.steps, run.losses, strict=True) if math.isfinite(x)]
    if loss_source == "train" and points:
        last = float(run.steps[-1])
        whole = [(s, x) for s, x in points if s * (1.0 + LOSS_WINDOW) <= last]
        points = whole or points
    return min((x for _, x in points), default=math.inf)


def default_targets(
    runs: Sequence[SweepRun], loss_source: LossSource = "eval"
) -> tuple[list[float], list[str]]:
    """Loss targets every batch size reaches, and warnings about batch sizes left out.

    A batch size reaches a loss as the frontier counts it: when one learning rate's median
    seed does (``frontier``). The hardest target is just above the loss the worst batch size
    reaches that way, the easiest halfway down from where the runs start (their lowest first
    point), at ``DEFAULT_TARGET_FRACTIONS`` of that range.
    """
    curves = [(r, [x for x in r.losses if math.isfinite(x)]) for r in runs]
    curves = [(r, c) for r, c in curves if c]
    if not curves:
        return [], ["no run has a loss curve: log `loss=` (or `eval_loss=`) to fit B_crit"]
    start = min(c[0] for _, c in curves)
    seeds: dict[tuple[float, object], list[float]] = {}
    for r, _ in curves:
        seeds.setdefault((r.batch_size, lr_key(r)), []).append(_reachable_loss(r, loss_source))
    best: dict[float, float] = {}
    for (batch_size, _), reached_by in seeds.items():
        # The median seed: the frontier's median crossing is finite once more than half of
        # the seeds arrive (all of them, for two).
        median_seed = sorted(reached_by)[len(reached_by) // 2]
        best[batch_size] = min(best.get(batch_size, math.inf), median_seed)
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


#: The run-config key under which a sweep's runs name the loss targets they were run for
#: (``python -m experiments`` writes its task's targets there).
TARGETS_CONFIG_KEY = "loss_targets"


def declared_targets(configs: Iterable[Mapping[str, object]]) -> list[float]:
    """The loss targets a sweep is analysed at by default when its runs declare them: the
    ``TARGETS_CONFIG_KEY`` list of their configs when every run that has the key gives the
    same positive numbers (largest first); [] otherwise, and then ``default_targets``.

    The one rule of default targets for a sweep that names its own: ``python -m experiments``
    declares and uses its task's targets, and the dashboard's pages default to them, so the
    terminal and the pages show the same critical batch sizes."""
    seen: set[tuple[float, ...]] = set()
    for config in configs:
        value = config.get(TARGETS_CONFIG_KEY)
        if value is None:
            continue
        if not isinstance(value, list | tuple) or not value:
            return []
        try:
            numbers = tuple(sorted({float(v) for v in value}, reverse=True))
        except (TypeError, ValueError):
            return []
        if not all(math.isfinite(v) and v > 0 for v in numbers):
            return []
        seen.add(numbers)
    return list(seen.pop()) if len(seen) == 1 else []


def _target_result(
    runs: Sequence[SweepRun], target: float, level: float, grid: Sequence[SweepRun]
) -> TargetResult:
    """One target's frontier, fit and warnings; ``grid`` holds every run tried (with those
    left out as diverged), which bounds the learning rates tried per batch size."""
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
        short = [
            b
            for b in sorted({r.batch_size for r in runs})
            if b not in sizes and b not in {p.batch_size for p in early}
        ]
        if short:
            warnings.append(
                f"not reached at batch size {', '.join(_fmt(b) for b in short)} (no learning "
                f"rate's median seed got to loss {target:g}): the fit uses the other "
                f"{len(sizes)} batch sizes (train those runs longer, or pick a higher target)"
            )
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
    # what a researcher would check next (_checks), after why the fit is or is not determined
    warnings += lr_grid_warnings(grid, points)
    seeds = seed_warning(points)
    if seeds is not None:
        warnings.append(seeds)
    return TargetResult(
        target=target,
        points=points,
        runs=per_run,
        s_min=None if fit is None else fit.s_min,
        e_min=None if fit is None else fit.e_min,
        # an undetermined B_crit is no number: the fit's value is kept as b_crit_estimate
        b_crit=fit.b_crit if determined and fit is not None else None,
        b_crit_lo=fit.b_crit_lo if determined and fit is not None else None,
        b_crit_hi=fit.b_crit_hi if determined and fit is not None else None,
        determined=determined,
        warnings=warnings,
        b_simple=b_simple[0],
        b_simple_lo=b_simple[1],
        b_simple_hi=b_simple[2],
        b_simple_reason=b_simple[3],
        curve=_curve(fit, sizes),
        b_crit_estimate=None if fit is None else fit.b_crit,
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
    keep_diverged: bool = False,
    declared: Sequence[float] = (),
) -> CriticalBatchReport:
    """The critical batch size per loss target. When none are given: ``declared`` (the
    targets the sweep's runs name, ``declared_targets``), else ``default_targets``.

    Runs whose loss diverged (``divergence``) are left out of the frontier and of the default
    targets, listed under ``excluded`` with the loss they rose to, unless ``keep_diverged``: a
    learning rate that blows up is no tuned one, and its early crossings would put an unstable
    run on the frontier. Either way a warning names them.
    """
    notes = list(warnings)
    grid = list(runs)
    blown = {r.uid: why for r in grid if (why := divergence(r.steps, r.losses)) is not None}
    left_out = list(excluded)
    if blown:
        names = "; ".join(f"{r.name} ({blown[r.uid]})" for r in grid if r.uid in blown)
        if keep_diverged:
            notes.append(
                f"{len(blown)} of {len(grid)} runs diverged and are kept in the analysis, as "
                f"asked: {names}"
            )
        else:
            runs = [r for r in grid if r.uid not in blown]
            left_out += [
                ExcludedRun(r.uid, r.name, "diverged", f"diverged: {blown[r.uid]}")
                for r in grid
                if r.uid in blown
            ]
            notes.append(
                f"{len(blown)} of {len(grid)} runs diverged (loss far above its minimum, or not "
                f"finite) and are left out of the frontier and the default targets: {names}"
            )
    chosen = [float(t) for t in (targets or declared)]
    if not chosen:
        chosen, target_notes = default_targets(runs, loss_source)
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
        excluded=left_out,
        warnings=notes,
        targets=[_target_result(runs, t, level, grid) for t in chosen],
    )
