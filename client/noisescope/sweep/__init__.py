"""The critical batch size of a task from its batch-size sweep: the one analysis of it.

McCandlish et al. (2018, Sec. 2.2-3; docs/science.md) define B_crit through the steps S and
examples E a run needs to reach a loss target *with its learning rate tuned*: across batch
sizes, S = S_min (1 + B_crit/B). A sweep usually holds several learning rates (and seeds) per
batch size, and only the fastest learning rate at each batch size belongs on that curve. So,
per loss target:

1. each run's crossing: the first step where its loss curve reaches the target, interpolated
   linearly between points (``crossing_step``). The curve is the run's evaluation loss when
   the task's runs logged one, else its training loss averaged over a centred window of
   steps ``(1 ± LOSS_WINDOW) s`` (``estimators.smooth_training_loss``): a single noisy
   minibatch never counts as reaching a target.
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

Before step 2, runs whose loss diverged (``divergence``: far above its minimum at the end, or
not finite) are left out, listed under ``excluded``. With step 3 come the checks a researcher
would make (``_checks``): a frontier learning rate at an edge of the grid tried
(``lr_grid_warnings``) and frontier points from a single seed (``seed_warning``).

Default targets (``default_targets``) are spread between where the runs start and the best
loss that *every* batch size reaches at its median seed (the frontier's count), so every
target can be fitted; a sweep whose runs name their targets in their config
(``TARGETS_CONFIG_KEY``, as ``python -m experiments`` does) is read at those by the dashboard
(``declared_targets``). Everything is pure
Python: the server runs it on stored data (``GET /api/v1/tasks/{project}/{task}/critical-batch``)
and the reproduction study on its own records, so both give the same numbers.

One module per part: ``_report`` (the inputs and the report's classes), ``_crossings`` (step
1), ``_frontier`` (steps 2 and 4), ``_checks`` (divergence, grid edges, seeds), ``_analyse``
(the targets, step 3 and the whole analysis).
Import from here: ``from noisescope.sweep import analyse``.
"""

from __future__ import annotations

from noisescope._public import report_all_as_public
from noisescope.estimators import LOSS_WINDOW as LOSS_WINDOW
from noisescope.estimators import smooth_training_loss as smooth_training_loss

from ._analyse import (
    CURVE_POINTS,
    DEFAULT_TARGET_FRACTIONS,
    MIN_BATCH_SIZES,
    TARGETS_CONFIG_KEY,
    analyse,
    declared_targets,
    default_targets,
)
from ._checks import (
    DIVERGED_GIVE_BACK,
    DIVERGED_MIN_RISE,
    DIVERGED_TAIL,
    divergence,
    lr_grid_warnings,
    seed_warning,
)
from ._crossings import crossing_step
from ._frontier import B_SIMPLE_WINDOW, BLOCKS_PER_RUN, b_simple_at_loss, frontier
from ._report import (
    CriticalBatchReport,
    CurvePoint,
    ExcludedRun,
    ExclusionKind,
    FrontierPoint,
    LossSource,
    NoiseBucket,
    RunAtTarget,
    SweepRun,
    TargetResult,
)

__all__ = [
    "BLOCKS_PER_RUN",
    "B_SIMPLE_WINDOW",
    "CURVE_POINTS",
    "DEFAULT_TARGET_FRACTIONS",
    "DIVERGED_GIVE_BACK",
    "DIVERGED_MIN_RISE",
    "DIVERGED_TAIL",
    "MIN_BATCH_SIZES",
    "TARGETS_CONFIG_KEY",
    "CriticalBatchReport",
    "CurvePoint",
    "ExcludedRun",
    "ExclusionKind",
    "FrontierPoint",
    "LossSource",
    "NoiseBucket",
    "RunAtTarget",
    "SweepRun",
    "TargetResult",
    "analyse",
    "b_simple_at_loss",
    "crossing_step",
    "declared_targets",
    "default_targets",
    "divergence",
    "frontier",
    "lr_grid_warnings",
    "seed_warning",
]

report_all_as_public(__name__)
