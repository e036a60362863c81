"""What a sweep analysis reads (a run's loss curve and noise sums) and what it answers (per
target: the frontier, the fit, B_simple at that loss)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

LossSource = Literal["eval", "train"]
#: Why a run is left out of a sweep (``ExcludedRun.kind``); ``reason`` says it in words.
ExclusionKind = Literal[
    "units", "no_batch_size", "batch_size_changed", "too_few_evaluations", "no_loss", "diverged"
]


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
    inside the batch sizes tried. Otherwise ``b_crit``, ``b_crit_lo`` and ``b_crit_hi`` are
    None, ``warnings`` say why, and the fit's point value is only ``b_crit_estimate`` (for
    charts and diagnosis, never an answer): a number in ``b_crit`` is always one to use.

    ``warnings`` also carry what a determined answer should be read with (docs/science.md,
    "What the sweep checks"): a frontier learning rate at an edge of the grid tried, or a
    frontier point from a single seed. Those leave ``determined`` as it is (the fit's
    statistics are sound; the steps it went through may be biased or their spread unmeasured)
    and say which batch sizes and what to run.
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
    #: The fitted hyperbola from a quarter of the smallest to 4x the largest batch (for charts;
    #: drawn from ``b_crit_estimate``, so it is an answer only where ``determined``).
    curve: list[CurvePoint] = field(default_factory=list)
    #: The fit's B_crit whether or not it is determined (None: no fit): what ``b_crit`` would
    #: be; read ``determined`` and ``warnings`` before using it.
    b_crit_estimate: float | None = None

    def b_simple_vs_b_crit(self) -> dict[str, float | None] | None:
        """This target as one point of B_simple against B_crit (McCandlish et al. 2018, Fig. 7;
        docs/science.md): ``target``, ``b_crit``, ``b_crit_lo``, ``b_crit_hi``, ``b_simple``,
        ``b_simple_lo`` and ``b_simple_hi``. None unless the fit is determined and B_simple at
        this loss was measured: an undetermined B_crit is no point of that comparison. The one
        row the dashboard's Compare tasks chart and the reproduction's summary figure draw."""
        if not (self.determined and self.b_crit is not None and self.b_simple is not None):
            return None
        return {
            "target": self.target,
            "b_crit": self.b_crit,
            "b_crit_lo": self.b_crit_lo,
            "b_crit_hi": self.b_crit_hi,
            "b_simple": self.b_simple,
            "b_simple_lo": self.b_simple_lo,
            "b_simple_hi": self.b_simple_hi,
        }


@dataclass(frozen=True)
class ExcludedRun:
    """A run the analysis left out: ``kind`` says why for code (e.g. ``"diverged"``),
    ``reason`` for people, with the run's own numbers."""

    uid: str
    name: str
    kind: ExclusionKind
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
