"""The gradient-noise-scale estimators: the one place where noisescope's maths lives.

Equation numbers refer to ``docs/science.md`` (McCandlish et al. 2018, "An Empirical Model
of Large-Batch Training", Appendix A.1 and Sections 2.2-3). Pure Python on purpose: the client
must import it in any training job without numpy, and the server and dashboard call the same
functions on sums computed in SQL.

One module per job, in the order the paper builds them: ``_two_batch`` (the two-batch
estimator, window sums, EMA, B_simple and B_noise), ``_stats`` (Student-t quantiles and
Fieller's interval for a ratio), ``_intervals`` (a window's intervals from blocks of steps, and
each bucket's of a series), ``_smoothing`` (the two smoothers: a centred window of the training
loss for crossings, trailing windows of exact sums for charts), ``_current`` (the
current-B_simple rule), ``_trend`` (B_simple now from the run's trend in the loss),
``_critical`` (the S-E model, the critical-batch fit, parallelism), ``_efficiency``
(statistical efficiency, goodput, learning-rate rules) and ``_branching`` (the local critical
batch from branching). Import from here:
``from noisescope.estimators import X``.
"""

from __future__ import annotations

from .._public import report_all_as_public
from ._branching import (
    MAX_RESOLVED_JUMP,
    LocalCriticalBatch,
    branch_mean_loss,
    epsilon_problem,
    local_critical_batch,
)
from ._critical import (
    MIN_SPEEDUP,
    CriticalBatchFit,
    compute_waste,
    doubling_speedup,
    examples_ratio,
    fit_critical_batch,
    parallelism_limit,
    steps_ratio,
)
from ._current import (
    CURRENT_BLOCK,
    CURRENT_FRACTION,
    CURRENT_MAX_FACTOR,
    CURRENT_MAX_FRACTION,
    CURRENT_MAX_REL_WIDTH,
    CURRENT_MIN_BLOCK,
    CURRENT_MIN_SAMPLES,
    CURRENT_RAW_LIMIT,
    CURRENT_SHIFT_LEVEL,
    CurrentNoiseScale,
    NoiseSamples,
    Trailing,
    current_noise_scale,
    current_window,
)
from ._efficiency import (
    adaptive_batch_target,
    goodput,
    goodput_optimal_batch,
    interpolate_throughput,
    noise_scaled_lr,
    scaled_lr,
    statistical_efficiency,
)
from ._intervals import (
    BUCKET_BLOCKS,
    INTERVAL_BLOCKS,
    MIN_INTERVAL_SAMPLES,
    BlockMoments,
    BucketNoiseScales,
    Interval,
    NoiseScaleInterval,
    b_simple_interval,
    block_moments,
    bucket_blocks,
    bucket_noise_scales,
    interval_from_blocks,
    interval_from_steps,
    reblock,
)
from ._smoothing import (
    LOSS_WINDOW,
    TrailingWindows,
    run_fraction_window,
    smooth_training_loss,
    trailing_windows,
    training_loss_curve,
)
from ._stats import (
    LineFit,
    check_level,
    check_non_negative,
    check_positive,
    fieller,
    student_t_quantile,
    weighted_line_fit,
)
from ._trend import (
    TREND_AGREE_LEVEL,
    TREND_BLOCKS,
    TREND_FRACTIONS,
    LossTrend,
    RunBlocks,
    jackknife_se,
    loss_trend,
    power_level,
    power_tilt,
)
from ._two_batch import (
    EMA,
    NoiseScale,
    b_noise_from_sums,
    b_simple_and_reason,
    b_simple_from_sums,
    two_batch_estimate_columns,
    two_batch_estimates,
    two_batch_expressions,
    two_batch_sizes_ok,
)

__all__ = [
    "BUCKET_BLOCKS",
    "CURRENT_BLOCK",
    "CURRENT_FRACTION",
    "CURRENT_MAX_FACTOR",
    "CURRENT_MAX_FRACTION",
    "CURRENT_MAX_REL_WIDTH",
    "CURRENT_MIN_BLOCK",
    "CURRENT_MIN_SAMPLES",
    "CURRENT_RAW_LIMIT",
    "CURRENT_SHIFT_LEVEL",
    "EMA",
    "INTERVAL_BLOCKS",
    "LOSS_WINDOW",
    "MAX_RESOLVED_JUMP",
    "MIN_INTERVAL_SAMPLES",
    "MIN_SPEEDUP",
    "TREND_AGREE_LEVEL",
    "TREND_BLOCKS",
    "TREND_FRACTIONS",
    "BlockMoments",
    "BucketNoiseScales",
    "CriticalBatchFit",
    "CurrentNoiseScale",
    "Interval",
    "LineFit",
    "LocalCriticalBatch",
    "LossTrend",
    "NoiseSamples",
    "NoiseScale",
    "NoiseScaleInterval",
    "RunBlocks",
    "Trailing",
    "TrailingWindows",
    "adaptive_batch_target",
    "b_noise_from_sums",
    "b_simple_and_reason",
    "b_simple_from_sums",
    "b_simple_interval",
    "block_moments",
    "branch_mean_loss",
    "bucket_blocks",
    "bucket_noise_scales",
    "check_level",
    "check_non_negative",
    "check_positive",
    "compute_waste",
    "current_noise_scale",
    "current_window",
    "doubling_speedup",
    "epsilon_problem",
    "examples_ratio",
    "fieller",
    "fit_critical_batch",
    "goodput",
    "goodput_optimal_batch",
    "interpolate_throughput",
    "interval_from_blocks",
    "interval_from_steps",
    "jackknife_se",
    "local_critical_batch",
    "loss_trend",
    "noise_scaled_lr",
    "parallelism_limit",
    "power_level",
    "power_tilt",
    "reblock",
    "run_fraction_window",
    "scaled_lr",
    "smooth_training_loss",
    "statistical_efficiency",
    "steps_ratio",
    "student_t_quantile",
    "trailing_windows",
    "training_loss_curve",
    "two_batch_estimate_columns",
    "two_batch_estimates",
    "two_batch_expressions",
    "two_batch_sizes_ok",
    "weighted_line_fit",
]

report_all_as_public(__name__)
