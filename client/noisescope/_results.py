"""What the read API answers, as plain frozen dataclasses: one definition for both ends.

The server's read side (``noisescope_server.queries``) builds these and encodes them as JSON;
``noisescope.Api`` decodes the same JSON back into them. The dashboard, a notebook and the
server therefore hold the very same fields. ``to_frame`` turns a list of any of them (or a
series' points) into a pandas frame when pandas is installed.

This module sits at the bottom of the client, beside the wire format: it imports only
``_format`` (``noisescope.protocol`` re-exports it, and the server imports that). The modules
that compute an answer import their types from here (``recommend``: ``Recommendation``,
``BatchOption``; ``sweep``: ``MIN_BATCH_SIZES``), never the other way round.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, TypedDict

from noisescope import _format

__all__ = [
    "MIN_BATCH_SIZES",
    "BatchOption",
    "BranchPointResult",
    "EventRow",
    "ParallelismPlan",
    "ParallelismRow",
    "Recommendation",
    "RecommendationResult",
    "RunBranches",
    "RunSeries",
    "RunSummary",
    "SeriesInfo",
    "SeriesPoint",
    "TaskSummary",
    "to_frame",
]

#: Fewest distinct batch sizes that must reach a target for a fit (``sweep.MIN_BATCH_SIZES``;
#: ``TaskSummary.swept`` reads it).
MIN_BATCH_SIZES = 3


@dataclass(frozen=True)
class RunSummary:
    """One run: metadata, progress, the batch in use, and its *current* B_simple.

    The current B_simple follows one rule everywhere (``estimators.current_noise_scale``,
    docs/science.md "The current B_simple"): a trailing window of at least
    ``CURRENT_FRACTION`` of the run's samples (and ``CURRENT_MIN_SAMPLES``), grown while its
    ``level`` interval is wider than ``CURRENT_MAX_REL_WIDTH`` times the value, but never past
    ``CURRENT_MAX_FRACTION`` of the run nor across a significant change of |G|^2 or tr(Sigma).
    Where that window's interval is not within ``CURRENT_MAX_FACTOR`` of its value, |G|^2 and
    tr(Sigma) as powers of the training loss over a longer stretch give the number when their
    interval is (``b_simple_trend``); else ``b_simple`` is None, with ``b_simple_reason`` (and
    ``b_simple_lower`` where a lower bound is known), and there is no ratio.
    """

    uid: str
    project: str
    task: str
    name: str
    tags: list[str]
    config: dict[str, Any]
    #: The batch size given at ``init`` (task units per optimizer step).
    batch_size: float | None
    units: str
    status: str
    started_at: datetime | None
    ended_at: datetime | None
    last_seen_at: datetime | None
    n_samples: int
    last_step: int | None
    last_examples: float | None
    last_loss: float | None
    last_eval_loss: float | None
    #: The batch in use now: the latest ``batch_size`` event, else ``batch_size``.
    batch_in_use: float | None
    #: "event", "run", or None when neither gives one.
    batch_in_use_source: str | None
    level: float
    b_simple: float | None
    b_simple_lo: float | None
    b_simple_hi: float | None
    b_simple_reason: str | None
    #: |G|^2 and tr(Sigma) over the same window (means of the per-sample estimates).
    g_sq: float | None
    trace_sigma: float | None
    #: The current window: its samples and its first and last steps.
    window_samples: int
    window_first_step: int | None
    window_last_step: int | None
    #: While ``b_simple`` is None: a ``level`` lower bound on it, where one is known (the
    #: window's |G|^2 is not significantly positive but its tr(Sigma) is).
    b_simple_lower: float | None
    #: Why the window stopped growing while its interval was still wide (a change of regime,
    #: or the reach cap); None when it did not need to.
    window_limit: str | None
    #: batch_in_use / b_simple (None when either is missing).
    batch_to_b_simple: float | None
    #: Why the run measures nothing, when its training loop said so (a ``notice`` event).
    notice: str | None
    #: A branch run (``noisescope.branch``): the run it branched from and the parent's step.
    parent_uid: str | None = None
    branch_step: int | None = None
    #: Whether the run's loss diverged (``sweep.divergence`` on its evaluations, else its
    #: smoothed training loss), and why ("training loss (smoothed): its loss rose from ...").
    #: A flag beside ``status``, not a status: ``status`` is the run's lifecycle (a diverged run
    #: may still be running or have finished), which filters and live pages rely on; the
    #: critical-batch analysis leaves such runs out.
    diverged: bool = False
    diverged_reason: str | None = None
    #: When the run was archived (None: it is not). An archived run is left out of lists,
    #: sweeps, comparisons and task summaries unless asked for; it still takes samples.
    archived_at: datetime | None = None
    #: Whether ``b_simple`` comes from the run's trend in the training loss (the window gave
    #: no number; ``estimators.loss_trend``): the window fields then name the samples the
    #: trend was fitted over.
    b_simple_trend: bool = False


@dataclass(frozen=True)
class SeriesPoint:
    """One bucket of a series (or, smoothed, the trailing window ending at that bucket).

    ``x`` is the middle of the bucket's x range (``x_lo``..``x_hi``); ``g_sq`` and
    ``trace_sigma`` are means of the per-sample estimates; ``b_simple`` is their ratio (None,
    with ``reason``, where not measurable) and ``b_simple_lo/hi`` its interval from the
    bucket's (or window's) blocks (None when too few samples to tell).
    """

    x: float
    x_lo: float
    x_hi: float
    step_lo: int
    step_hi: int
    examples_hi: float | None
    n: int
    sum_g_sq: float
    sum_trace_sigma: float
    g_sq: float
    trace_sigma: float
    b_simple: float | None
    b_simple_lo: float | None
    b_simple_hi: float | None
    reason: str | None
    loss: float | None
    lr: float | None
    #: The largest B_big in the bucket: the batch in use.
    batch_size: float | None


@dataclass(frozen=True)
class RunSeries:
    run_uid: str
    series: str
    x: str
    units: str
    n_samples: int
    #: "samples" (bucketed from raw rows) or "blocks" (from pre-summed 64-sample blocks).
    source: str
    #: Trailing smoothing window in steps (0: none, each bucket on its own).
    window_steps: float
    points: list[SeriesPoint]

    def to_frame(self) -> Any:
        """The points as a pandas frame (one row per bucket)."""
        return to_frame(self.points)


@dataclass(frozen=True)
class SeriesInfo:
    name: str
    n_samples: int


@dataclass(frozen=True)
class EventRow:
    step: int
    kind: str
    payload: dict[str, Any]
    time: float | None
    seq: int | None


@dataclass(frozen=True)
class TaskSummary:
    """A task across its runs; the B_simple columns summarise the runs' current B_simple."""

    project: str
    task: str
    n_runs: int
    n_running: int
    n_samples: int
    batch_sizes: list[float]
    units: list[str]
    last_started_at: datetime | None
    n_measured: int
    b_simple_median: float | None
    b_simple_min: float | None
    b_simple_max: float | None
    #: Runs whose current B_simple here is as the server last stored it, before their newest
    #: samples (or not yet read: then not among the measured): at thousands of live runs one
    #: task list reads a bounded number of windows, the farthest behind first, and the server
    #: stores the rest again within seconds (docs/api.md). 0 from a server before it was
    #: reported.
    n_behind: int = 0
    #: Of ``n_behind``, the runs the server has not read at all yet (no digest stored): not
    #: among the measured here, whatever their samples hold, until it does, within seconds.
    #: 0 from a server before it was reported.
    n_unread: int = 0

    @property
    def swept(self) -> bool:
        """Whether the task's runs span the batch sizes a sweep fit needs
        (``sweep.MIN_BATCH_SIZES``): only then can it have a critical batch size."""
        return len(self.batch_sizes) >= MIN_BATCH_SIZES


@dataclass(frozen=True)
class ParallelismRow:
    """Training with ``devices`` x ``per_device_batch`` (docs/science.md's S-E model)."""

    devices: int
    batch_size: float
    #: S/S_min and E/E_min.
    steps_ratio: float
    examples_ratio: float
    #: Speed-up over one device (S(b)/S(N b)) and from the previous row's doubling.
    speedup: float
    doubling_speedup: float | None
    #: Share of the examples processed beyond the minimum, 1 - E_min/E.
    waste: float
    #: Absolute steps and wall time, when S_min (and a step time) are known.
    steps: float | None
    hours: float | None
    #: Whether the doubling to this row sped training up by less than the plan's
    #: ``min_speedup`` (``recommend.doubling_pays``; never the one-device row).
    past_limit: bool


@dataclass(frozen=True)
class ParallelismPlan:
    """How far a task parallelises at B_crit, from the S-E model with ideal scaling."""

    b_crit: float
    per_device_batch: float
    min_speedup: float
    #: Devices past which each doubling speeds training up by less than ``min_speedup``.
    device_limit: float
    #: The batch past which doubling buys less than ``min_speedup``, B_crit (1 - s/2)/(s - 1),
    #: and the compute waste there; meaningful even when ``device_limit`` is below one device.
    limit_batch_size: float
    limit_waste: float
    #: The most devices (a power of two) every doubling to which paid ``min_speedup``: the
    #: summary's "past N devices", the last row not ``past_limit``.
    paying_devices: int
    s_min: float | None
    step_time: float | None
    rows: list[ParallelismRow]
    summary: str
    #: For a chosen batch size: the sentence ``recommend.verdict`` gives against ``b_crit``.
    batch_size: float | None = None
    verdict: str | None = None
    #: What ``b_crit`` is: "B_crit" (a sweep fit) or "B_simple" (taken as B_crit ≈ B_simple).
    reference: str = "B_crit"


class PlanOptions(TypedDict, total=False):
    """The options of ``recommend.parallelism_plan`` as ``Api.parallelism`` takes them and
    sends them on (the server calls the function with them): those left out take the
    function's defaults there."""

    s_min: float | None
    step_time: float | None
    min_speedup: float
    max_devices: int | None
    units: str
    batch_size: float | None
    reference: str


@dataclass(frozen=True)
class BranchPointResult:
    """The local critical batch size at one branch step of a run, from its branch runs'
    final evaluation losses (``estimators.local_critical_batch``; docs/branching.md).

    ``mean_loss`` is per batch size (None for a batch size whose branches diverged);
    ``b_crit`` is None (with ``reason``) while branches are missing an evaluation, when every
    batch stayed within ε (then ``b_crit_lo`` is the largest batch tried, a lower bound), or
    when the batch-size grid does not resolve the crossing (a bracket: ``b_crit_lo`` and
    ``b_crit_hi`` the grid points around it; ``b_crit_interpolated`` the log-linear reading,
    not a measurement). A number's interval spans at least the grid cell around it.
    ``parent_loss`` is the parent's last evaluation at or before the branch step;
    ``parent_examples`` the most examples (tokens) its samples at or before that step report
    (None when they report none).
    """

    step: int
    parent_loss: float | None
    epsilon: float
    level: float
    batch_sizes: list[float]
    mean_loss: list[float | None]
    seeds: int
    n_runs: int
    run_ids: list[str]
    b_crit: float | None
    b_crit_lo: float | None
    b_crit_hi: float | None
    reason: str | None
    parent_examples: float | None = None
    b_crit_interpolated: float | None = None


@dataclass(frozen=True)
class RunBranches:
    """A run's branch points (in the run's units) and where the local B_crit plateaus."""

    run_uid: str
    units: str
    points: list[BranchPointResult]
    plateau_step: int | None
    plateau_b_crit: float | None
    plateau_reason: str | None


@dataclass(frozen=True)
class BatchOption:
    """Predicted cost of training at ``batch_size`` (docs/science.md, B_crit ≈ B_simple)."""

    batch_size: float
    #: S/S_min = 1 + B_crit/B: optimizer steps relative to the minimum.
    steps_ratio: float
    #: E/E_min = 1 + B/B_crit: examples relative to the minimum.
    examples_ratio: float
    #: (φ + B0)/(φ + B): per-example progress relative to the reference batch B0 (Pollux).
    efficiency: float
    #: Measured or interpolated examples per second, and goodput = throughput × efficiency.
    throughput: float | None = None
    goodput: float | None = None


@dataclass(frozen=True)
class Recommendation:
    """A recommendation for one run at one point in training.

    All predictions are None with a ``reason`` while B_simple is not yet measurable.
    """

    batch_size: float
    b_simple: float | None
    b_simple_lo: float | None
    b_simple_hi: float | None
    level: float | None
    reference_batch: float
    #: The batch in use.
    current: BatchOption | None
    #: Candidate batch sizes, ascending.
    options: tuple[BatchOption, ...]
    #: Goodput-maximising batch among the measured/candidate sizes (needs ``throughput``).
    goodput_batch_size: float | None
    #: The critical-batch point B ≈ B_simple: 2x the minimum steps and 2x the minimum examples.
    critical_batch_size: float | None
    reason: str | None = None
    #: The batch in use against B_simple in one sentence (``verdict``, or ``bound_verdict``
    #: when only a lower bound is known).
    verdict: str = ""
    #: While ``b_simple`` is None: a ``level`` lower bound on it, where one is known.
    b_simple_lower: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        """One line a training script can print."""
        count = _format.count
        if self.b_simple is None or self.current is None:
            if self.b_simple_lower is not None:
                return f"B_simple ≥ {count(self.b_simple_lower)}; {self.verdict}"
            return f"batch {count(self.batch_size)}: {self.reason or 'not yet measurable'}"
        interval = ""
        if self.b_simple_lo is not None and self.b_simple_hi is not None:
            interval = f" [{count(self.b_simple_lo)}, {count(self.b_simple_hi)}]"
        line = (
            f"B_simple {count(self.b_simple)}{interval}; batch {count(self.batch_size)}: "
            f"{_format.ratio(self.current.steps_ratio)}× min steps, "
            f"{_format.ratio(self.current.examples_ratio)}× min examples"
        )
        if self.goodput_batch_size is not None:
            line += f"; goodput-optimal batch {count(self.goodput_batch_size)}"
        return line


@dataclass(frozen=True)
class RecommendationResult:
    """``GET /runs/{id}/recommendation``: the run's current B_simple turned into advice."""

    run_id: str
    units: str
    last_step: int | None
    window_samples: int
    #: Where ``recommendation.batch_size`` came from: "query", "event" or "run".
    batch_size_source: str
    recommendation: Recommendation


def _row(item: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(item) and not isinstance(item, type):
        return {f.name: getattr(item, f.name) for f in dataclasses.fields(item)}
    if isinstance(item, dict):
        return dict(item)
    raise TypeError(f"cannot make a frame row of {type(item).__name__}")


def to_frame(items: Sequence[Any]) -> Any:
    """A pandas ``DataFrame`` with one row per dataclass (its fields as columns)."""
    try:
        import pandas as pd
    except ImportError as exc:  # pragma: no cover - pandas is optional for the client
        raise ImportError("to_frame needs pandas: pip install pandas") from exc
    if not items:
        return pd.DataFrame()
    fields = (
        [f.name for f in dataclasses.fields(items[0])]
        if dataclasses.is_dataclass(items[0])
        else None
    )
    return pd.DataFrame([_row(i) for i in items], columns=fields)
