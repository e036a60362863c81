"""What the current-truth study keeps of each run (``experiments.current_truth``): the run,
its trace, and the rule's outcome against the exact values."""

from __future__ import annotations

from dataclasses import dataclass, field

from experiments.current_limits import ModelAnswer, TrendLimit
from noisescope.estimators import CurrentNoiseScale

#: Micro-batches per step: the two batch sizes are B/k and B (docs/science.md).
MICRO = 2
#: A run whose loss leaves this multiple of its starting loss (or turns non-finite) diverged
#: and stops there; its last 10% is then the steps before the blow-up.
DIVERGED_FACTOR = 3.0
#: The seed of the held-out runs (the grid, used to choose the rule, is seed 0).
HELD_OUT_SEED = 1


@dataclass(frozen=True)
class StudyRun:
    task: str
    optimizer: str
    batch_size: int
    lr: float
    steps: int
    #: the network's initialisation and the batches drawn
    seed: int = 0


@dataclass(frozen=True)
class Trace:
    """What one run measured: each step's two-batch estimates and the exact values at some
    steps. The rule is judged on it after training (``evaluate``), so a trace is cached and a
    change of the rule is rejudged without training again."""

    run: StudyRun
    steps_run: int
    diverged: bool
    #: per step: step, unbiased |G|² and tr(Σ) estimates (``two_batch_estimates``)
    samples: list[tuple[float, float, float]]
    #: (step, exact |G|², exact tr(Σ))
    truth: list[tuple[float, float, float]]
    #: per sample: the batch's training loss (what the client records with each sample)
    losses: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class RunOutcome:
    """What the rule reported at the run's end against the exact values."""

    run: StudyRun
    steps_run: int
    diverged: bool
    window: CurrentNoiseScale
    window_steps: tuple[float, float] | None
    #: Exact B_simple (ratio of the exact means) over the last 10% of steps and over the window.
    exact_last: float
    exact_window: float | None
    #: What the rule before this one said: the window grown to the whole run if need be.
    previous: float | None
    #: The most a trend over the run could say (``current_limits``), against ``exact_last``.
    limits: tuple[TrendLimit, ...] = ()
    #: What each trend model tried for issue 58 says of B_simple now (``current_limits``).
    models: tuple[ModelAnswer, ...] = ()

    @property
    def number(self) -> float | None:
        return self.window.b_simple

    @property
    def within_2x(self) -> bool | None:
        if self.number is None:
            return None
        return 0.5 <= self.number / self.exact_last <= 2.0

    @property
    def covered(self) -> bool | None:
        """Whether the interval holds what it speaks of: the window's ratio of sums, the exact
        value over the window; the loss trend, the exact value now (the last 10%)."""
        iv = self.window.interval.b_simple
        truth = self.exact_last if self.window.trend else self.exact_window
        if iv is None or truth is None:
            return None
        return iv.lo <= truth <= iv.hi

    @property
    def covered_now(self) -> bool | None:
        """Whether the interval covers the exact value over the run's last 10% (issue 58)."""
        iv = self.window.interval.b_simple
        return None if iv is None else iv.lo <= self.exact_last <= iv.hi

    @property
    def bound_holds(self) -> bool | None:
        bound = self.window.lower_bound
        if bound is None or self.exact_window is None:
            return None
        return bound <= self.exact_window
