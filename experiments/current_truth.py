"""``python -m experiments.current_truth [--quick] [--docs DIR]``: "B_simple now" against its
exact value on messy training runs.

Each run trains a small network on a fixed finite training set, batches drawn with
replacement, so a batch gradient has covariance Σ/B exactly (docs/science.md eq. 1) and
|G|² and tr(Σ) at any parameters follow from the per-example gradients over the whole set
(``torch.func``): G = mean_i g_i, tr(Σ) = mean_i |g_i|² − |G|². The runs are what a sweep
looks like in practice: SGD with momentum and Adam, batch sizes spanning 32×, learning rates
from too small to divergent. The measured two-batch samples go through the one current rule
(``estimators.NoiseSamples``, as ``NoiseTracker``, the scheduler and the server read them);
the exact values are taken every few steps. Writes the section "current-truth" of
``docs/reproduction.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from experiments import sections
from experiments.current_limits import (
    LIMIT_FRACTIONS,
    MODEL_FRACTIONS,
    MODEL_WINDOWS,
    SHAPE_SMOOTHING,
    ModelAnswer,
    TrendLimit,
    trend_limits,
    trend_models,
)
from experiments.current_tasks import (
    TASKS,
    TRUTH_EVERY,
    TRUTH_EVERY_RECENT,
    TRUTH_RECENT,
    Task,
    make_optimizer,
)
from noisescope._format import count
from noisescope.estimators import (
    CURRENT_FRACTION,
    CURRENT_MAX_FACTOR,
    CurrentNoiseScale,
    NoiseSamples,
    interval_from_blocks,
    two_batch_estimates,
)

__all__ = [
    "RunOutcome",
    "StudyRun",
    "Trace",
    "evaluate",
    "held_out_runs",
    "main",
    "run_study",
    "study_runs",
    "traces",
]

SECTION = "current-truth"
#: Micro-batches per step: the two batch sizes are B/k and B (docs/science.md).
MICRO = 2
#: A run whose loss leaves this multiple of its starting loss (or turns non-finite) diverged
#: and stops there; its last 10% is then the steps before the blow-up.
DIVERGED_FACTOR = 3.0


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


# --- one run -------------------------------------------------------------------------------


def _ratio_of_means(points: Sequence[tuple[float, float, float]]) -> float | None:
    """Exact B_simple over some steps: mean tr(Σ) / mean |G|² (a window's ratio of sums)."""
    if not points:
        return None
    g = sum(p[1] for p in points) / len(points)
    s = sum(p[2] for p in points) / len(points)
    return s / g if g > 0 else math.inf


def _previous_rule(samples: NoiseSamples) -> float | None:
    """The rule this one replaced, for the comparison: the trailing 10% (at least 64), doubled
    back toward the start until the interval is no wider than the value or the whole run."""
    n = len(samples)
    target = max(math.ceil(CURRENT_FRACTION * n), 64)
    while True:
        interval = interval_from_blocks(*samples.trailing(target))
        b_iv = interval.b_simple
        if target >= n or (b_iv is not None and b_iv.hi - b_iv.lo <= b_iv.value):
            return None if b_iv is None else b_iv.value
        target *= 2


def _truth_due(task: Task, step: int, planned: int) -> bool:
    recent = step >= (1.0 - TRUTH_RECENT) * planned
    return step % (task.truth_every_recent if recent else task.truth_every) == 0


def train(run: StudyRun) -> Trace:
    """Train one run, measuring two-batch samples each step and the exact values at the steps
    ``_truth_due`` names."""
    seed = run.seed
    torch.manual_seed(seed)
    task = TASKS[run.task](seed)
    params = list(task.model.parameters())
    opt = make_optimizer(run.optimizer, params, run.lr)
    gen = torch.Generator().manual_seed(seed + 1)
    samples: list[tuple[float, float, float]] = []
    losses: list[float] = []
    truth: list[tuple[float, float, float]] = []
    m = run.batch_size // MICRO
    start_loss = task.full_loss()
    diverged = False
    step = 0
    for step in range(run.steps):
        due = _truth_due(task, step, run.steps)
        if due:
            g_sq, trace_sigma = task.truth()
            truth.append((float(step), g_sq, trace_sigma))
        idx = torch.randint(0, task.n, (run.batch_size,), generator=gen)
        opt.zero_grad()
        g_small_sq = 0.0
        batch_loss = 0.0
        acc = torch.zeros(sum(p.numel() for p in params))
        for j in range(MICRO):
            loss = task.loss(idx[j * m : (j + 1) * m]) / MICRO
            loss.backward()
            batch_loss += float(loss.detach())
            # the micro-batch gradient is the change of .grad, scaled back by k
            now = torch.cat([p.grad.reshape(-1) for p in params if p.grad is not None])
            g_small_sq += float(((now - acc) * MICRO).pow(2).sum()) / MICRO
            acc = now.clone()
        g_big_sq = float(acc.pow(2).sum())
        if not (math.isfinite(g_small_sq) and math.isfinite(g_big_sq)):
            diverged = True
            break
        samples.append((float(step), *two_batch_estimates(m, run.batch_size, g_small_sq, g_big_sq)))
        losses.append(batch_loss)
        opt.step()
        if due:
            loss_now = task.full_loss()
            if not math.isfinite(loss_now) or loss_now > DIVERGED_FACTOR * start_loss:
                diverged = True
                break
    return Trace(run, step + 1, diverged, samples, truth, losses)


def evaluate(trace: Trace) -> RunOutcome:
    """The rule's answer at the end of a trace against the exact values."""
    samples = NoiseSamples()
    for (step, g_sq, trace_sigma), loss in zip(trace.samples, trace.losses, strict=True):
        samples.add(step, g_sq, trace_sigma, loss)
    steps_run, truth = trace.steps_run, trace.truth
    window = samples.current()
    window_steps = samples.steps(window)
    last = [p for p in truth if p[0] >= (1.0 - CURRENT_FRACTION) * steps_run]
    in_window = (
        [p for p in truth if window_steps[0] <= p[0] <= window_steps[1]] if window_steps else []
    )
    exact_last = _ratio_of_means(last or truth[-1:])
    assert exact_last is not None
    return RunOutcome(
        run=trace.run,
        steps_run=steps_run,
        diverged=trace.diverged,
        window=window,
        window_steps=window_steps,
        exact_last=exact_last,
        exact_window=_ratio_of_means(in_window),
        previous=_previous_rule(samples),
        limits=tuple(trend_limits(trace.samples, truth, (1.0 - CURRENT_FRACTION) * steps_run)),
        models=tuple(trend_models(trace.samples, trace.losses)),
    )


# --- the study -----------------------------------------------------------------------------

_GRIDS: dict[str, dict[str, tuple[float, ...]]] = {
    "digits": {"sgdm": (0.03, 0.3, 1.0), "adam": (1e-3, 1e-2, 0.1)},
    "bytelm": {"adam": (1e-3, 4e-3, 3e-2)},
}


def study_runs(quick: bool, seeds: Sequence[int] = (0,)) -> list[StudyRun]:
    """The sweep: digits with SGD+momentum and Adam (batch sizes 8-256), the byte LM with Adam
    (2-64 sequences): 32× each, learning rates from slow to divergent, once per seed.
    ``quick``: digits at 3 batch sizes and the ends of each lr grid, shorter (the CI test)."""
    runs = []
    for seed in seeds:
        for task, grids in _GRIDS.items():
            if quick and task != "digits":
                continue
            sizes = (8, 64, 256) if quick else (8, 16, 32, 64, 128, 256)
            if task == "bytelm":  # sequences of 32 bytes
                sizes = (2, 4, 8, 16, 32, 64)
            steps = 600 if quick else (1000 if task == "digits" else 400)
            for optimizer, lrs in grids.items():
                for lr in (lrs[0], lrs[-1]) if quick else lrs:
                    for b in sizes:
                        runs.append(StudyRun(task, optimizer, b, lr, steps, seed))
    return runs


#: Runs kept out of choosing how "B_simple now" reads a run (issue 58: the trend candidates
#: were tried on seed 0's runs only): another seed, each optimizer's and task's middle rate,
#: batch sizes over 16x.
_HELD_OUT: tuple[tuple[str, str, float, tuple[int, ...]], ...] = (
    ("digits", "sgdm", 0.3, (16, 64, 256)),
    ("digits", "adam", 0.01, (16, 64, 256)),
    ("bytelm", "adam", 4e-3, (4, 16, 64)),
)
HELD_OUT_SEED = 1


def held_out_runs() -> list[StudyRun]:
    """The held-out runs (``_HELD_OUT``), at the study's full length."""
    return [
        StudyRun(task, opt, b, lr, 1000 if task == "digits" else 400, HELD_OUT_SEED)
        for task, opt, lr, sizes in _HELD_OUT
        for b in sizes
    ]


def _trace_path(cache: Path, run: StudyRun) -> Path:
    """A trace's file, named by its run and what else it depends on (a change trains again)."""
    task = TASKS[run.task]
    measured = (
        f"micro{MICRO}-div{DIVERGED_FACTOR:g}-loss-truth{task.truth_every}.{task.truth_every_recent}"
        f".{TRUTH_RECENT:g}"
    )
    name = f"{run.task}-{run.optimizer}-b{run.batch_size}-lr{run.lr:g}-s{run.steps}"
    if run.seed:
        name += f"-seed{run.seed}"
    return cache / measured / f"{name}.json"


def _load(path: Path, run: StudyRun) -> Trace | None:
    try:
        raw = json.loads(path.read_text())
        return Trace(
            run,
            int(raw["steps_run"]),
            bool(raw["diverged"]),
            [(float(a), float(b), float(c)) for a, b, c in raw["samples"]],
            [(float(a), float(b), float(c)) for a, b, c in raw["truth"]],
            [float(x) for x in raw["losses"]],
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _save(path: Path, trace: Trace) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "steps_run": trace.steps_run,
        "diverged": trace.diverged,
        "samples": trace.samples,
        "truth": trace.truth,
        "losses": trace.losses,
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body))
    tmp.replace(path)


def traces(
    runs: Sequence[StudyRun],
    *,
    cache: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[Trace]:
    """Each run's trace: read from ``cache`` when a run there matches, else trained (and then
    written there)."""
    out = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same floats on every machine: these runs are chaotic
    try:
        for i, run in enumerate(runs):
            t0 = time.perf_counter()
            path = None if cache is None else _trace_path(cache, run)
            trace = None if path is None else _load(path, run)
            how = "cached"
            if trace is None:
                trace, how = train(run), "trained"
                if path is not None:
                    _save(path, trace)
            out.append(trace)
            if progress:
                progress(
                    f"[{i + 1}/{len(runs)}] {run.task} {run.optimizer} b={run.batch_size} "
                    f"lr={run.lr:g}: {how}, {time.perf_counter() - t0:.1f} s"
                )
    finally:
        torch.set_num_threads(threads)
    return out


def run_study(
    runs: Sequence[StudyRun],
    *,
    cache: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[RunOutcome]:
    """The rule judged on every run of the study (``traces``, then ``evaluate``)."""
    return [evaluate(t) for t in traces(runs, cache=cache, progress=progress)]


def _reported(o: RunOutcome) -> str:
    iv = o.window.interval.b_simple
    if iv is not None:
        trend = " (trend)" if o.window.trend else ""
        return f"{count(iv.value)} [{count(iv.lo)}–{count(iv.hi)}]{trend}"
    if o.window.lower_bound is not None:
        return f"≥ {count(o.window.lower_bound)}"
    return "not measurable"


def summary(outcomes: Sequence[RunOutcome]) -> dict[str, float]:
    """The acceptance figures: runs with a number, numbers within 2× of the exact value over
    the last 10%, intervals covering the exact value over their window, bounds that hold, all
    statements that hold; and for the previous rule, its numbers within 2×."""
    numbers = [o for o in outcomes if o.number is not None]
    bounds = [o for o in outcomes if o.bound_holds is not None]
    prev = [o for o in outcomes if o.previous is not None]
    return {
        "runs": len(outcomes),
        "numbers": len(numbers),
        "within_2x": sum(bool(o.within_2x) for o in numbers),
        "covered": sum(bool(o.covered) for o in numbers),
        "bounds": len(bounds),
        "bounds_hold": sum(bool(o.bound_holds) for o in bounds),
        #: statements that hold: intervals covering the exact value, bounds below it
        "holds": sum(bool(o.covered) for o in numbers) + sum(bool(o.bound_holds) for o in bounds),
        "previous_numbers": len(prev),
        "previous_within_2x": sum(0.5 <= (o.previous or 0) / o.exact_last <= 2.0 for o in prev),
        **_limit_figures(outcomes),
        **_model_figures(outcomes),
        "held_out": sum(o.run.seed == HELD_OUT_SEED for o in outcomes),
        "held_out_numbers": sum(o.run.seed == HELD_OUT_SEED for o in numbers),
        "held_out_within_2x": sum(
            o.run.seed == HELD_OUT_SEED and bool(o.within_2x) for o in numbers
        ),
        "trend": sum(o.window.trend for o in numbers),
        "covered_now": sum(bool(o.covered_now) for o in numbers),
        "held_out_covered_now": sum(
            o.run.seed == HELD_OUT_SEED and bool(o.covered_now) for o in numbers
        ),
    }


def _limit_figures(outcomes: Sequence[RunOutcome]) -> dict[str, float]:
    """Per trailing fraction: runs where the exact trend states a number, and those whose
    interval covers the exact value over the last 10%."""
    out: dict[str, float] = {}
    for fraction in LIMIT_FRACTIONS:
        stated = [
            (o.exact_last, t.interval)
            for o in outcomes
            for t in o.limits
            if t.fraction == fraction and t.states_number and t.interval is not None
        ]
        out[f"trend_{fraction:g}"] = len(stated)
        out[f"trend_{fraction:g}_covered"] = sum(iv.lo <= x <= iv.hi for x, iv in stated)
    return out


def _model_figures(outcomes: Sequence[RunOutcome]) -> dict[str, float]:
    """Per trend model: runs with a number, those within 2× of the exact value over the last
    10%, the intervals covering it; the same over the held-out runs."""
    out: dict[str, float] = {}
    for model in MODEL_FRACTIONS:
        for group, runs in (
            ("", outcomes),
            ("held_out_", [o for o in outcomes if o.run.seed == HELD_OUT_SEED]),
        ):
            stated = [
                (o.exact_last, a.interval)
                for o in runs
                for a in o.models
                if a.model == model and a.states_number and a.interval is not None
            ]
            out[f"{group}{model}_numbers"] = len(stated)
            out[f"{group}{model}_within_2x"] = sum(0.5 <= iv.value / x <= 2.0 for x, iv in stated)
            out[f"{group}{model}_covered"] = sum(iv.lo <= x <= iv.hi for x, iv in stated)
    return out


def _models(answers: Sequence[ModelAnswer]) -> str:
    """Each trend model's number, else a dash (its interval too wide or none)."""
    numbers = [count(a.interval.value) if a.states_number and a.interval else "—" for a in answers]
    return " / ".join(numbers) or "—"


def _limit(limits: Sequence[TrendLimit]) -> str:
    """A run's trend limits, as the widest side of each interval relative to its value
    (x1.9 or less: a number; ∞: no interval)."""
    out = []
    for t in limits:
        iv = t.interval
        factor = math.inf if iv is None or iv.lo <= 0 else max(iv.value / iv.lo, iv.hi / iv.value)
        out.append("∞" if math.isinf(factor) else f"×{factor:.2g}")
    return " / ".join(out) or "—"


def _misses(outcomes: Sequence[RunOutcome]) -> list[str]:
    """A line for each number not within 2× of the last 10%'s exact value, with its window's."""
    lines = []
    for o in outcomes:
        if o.number is None or o.within_2x:
            continue
        r, steps = o.run, o.window_steps
        window = f"{count(steps[0])}–{count(steps[1])}" if steps else "?"
        held = "holds" if o.covered else "misses"
        lines.append(
            f"- not within 2×: {r.task} {r.optimizer} batch {r.batch_size} lr {r.lr:g}: "
            f"{count(o.number)} against {count(o.exact_last)} over the last 10% "
            f"({o.number / o.exact_last:.2f}×); over its window (steps {window}) the exact "
            f"value is {count(o.exact_window or math.nan)}, which its interval {held}"
        )
    return lines


def render(outcomes: Sequence[RunOutcome], command: str) -> str:
    s = summary(outcomes)
    lines = [
        '## "B_simple now" against its exact value on messy runs',
        "",
        f"Written by `{command}`. Each run trains on a fixed finite training set sampled "
        "with replacement, so |G|² and tr(Σ) at any step follow exactly from the per-example "
        "gradients over the whole set (digits: in closed form at every step; the byte LM: "
        f"`torch.func` at every {TRUTH_EVERY_RECENT}th step over the last {TRUTH_RECENT:.0%} "
        f"of a run's planned steps, every {TRUTH_EVERY}th before). "
        f"The runs' two-batch samples ({MICRO} micro-batches a step) go through the one "
        "current rule (`estimators.NoiseSamples`, as the server, `NoiseTracker` and the "
        "scheduler read them). *exact (last 10%)* is mean tr(Σ) / mean |G|² over the run's "
        "last 10% of steps; *in interval* compares the reported interval with the exact value "
        "over the window it names; *previous rule* is what the window grown back to the whole "
        f"run said. A run stops as diverged when its loss leaves {DIVERGED_FACTOR:g}× its "
        "start or turns non-finite.",
        "",
        f"- runs: {s['runs']}; with a number: {s['numbers']} "
        f"({s['numbers'] / max(s['runs'], 1):.0%}); the rest a lower bound ({s['bounds']}) or "
        "not measurable",
        f"- numbers within 2× of the exact value over the last 10%: {s['within_2x']} of "
        f"{s['numbers']}",
        f"- of the numbers, {s['trend']} from the loss trend (`estimators.loss_trend`: where "
        "the window states none), the rest the window's; the trend model *loss* below is the "
        "same trend on every run, without the window first",
        f"- intervals containing the exact value they speak of (the window's over the window, "
        f"the trend's now): {s['covered']} of {s['numbers']}; containing the exact value over "
        f"the last 10%: {s['covered_now']} of {s['numbers']}",
        f"- lower bounds at or below the exact value over their window: {s['bounds_hold']} of "
        f"{s['bounds']}",
        f"- every statement (an interval or a bound) that holds: {s['holds']} of "
        f"{s['numbers'] + s['bounds']}",
        f"- the previous rule (grown to the whole run): {s['previous_within_2x']} of "
        f"{s['previous_numbers']} numbers within 2×",
        f"- on the seed-0 runs (the ones the loss trend was chosen on): "
        f"{s['runs'] - s['held_out']} runs, {s['numbers'] - s['held_out_numbers']} with a "
        f"number, {s['within_2x'] - s['held_out_within_2x']} of them within 2×, "
        f"{s['covered_now'] - s['held_out_covered_now']} of their intervals containing the "
        "exact value over the last 10%",
        f"- held out (seed {HELD_OUT_SEED}, not used in choosing the rule's loss trend or the "
        "trend models below): "
        f"{s['held_out']} runs, "
        f"{s['held_out_numbers']} with a number, {s['held_out_within_2x']} of them within 2×, "
        f"{s['held_out_covered_now']} of their intervals containing the exact value over the "
        "last 10%",
        *_misses(outcomes),
        *(
            f"- trend model *{model}* (over {window}; `experiments/current_"
            f"{'loss' if model == 'loss' else 'limits'}.py`): a number on "
            f"{s[f'{model}_numbers']} of {s['runs']} runs, {s[f'{model}_within_2x']} of them "
            f"within 2× of the exact value over the last 10%, {s[f'{model}_covered']} of their "
            "intervals covering it; on the held-out runs "
            f"{s[f'held_out_{model}_numbers']} numbers, {s[f'held_out_{model}_within_2x']} "
            f"within 2×, {s[f'held_out_{model}_covered']} covering"
            for model, window in MODEL_WINDOWS.items()
        ),
        "- with the exact trend known (issue 58; `experiments/current_limits.py`): a model "
        "that knew the smooth trend of |G|² and tr(Σ) along the run exactly (the exact values, "
        f"averaged over ±{SHAPE_SMOOTHING:.0%} of the run about each step) and measured only "
        "their scale over a trailing window, with Fieller's "
        "interval from the blocks' residuals about the shapes, states a number within "
        f"{CURRENT_MAX_FACTOR:g}× on "
        + ", ".join(
            f"{s[f'trend_{fraction:g}']} (last {fraction:.0%}; "
            f"{s[f'trend_{fraction:g}_covered']} covering the exact value over the last 10%)"
            for fraction in LIMIT_FRACTIONS
        )
        + f" of {s['runs']} runs (the rule above: {s['numbers']}): the bound a real trend "
        "model can approach only by following the run as closely. Column *trend limit* gives "
        "each such interval's widest side relative to its value ("
        + " / ".join(f"last {fraction:.0%}" for fraction in LIMIT_FRACTIONS)
        + ")",
        "",
        "| task | optimizer | batch | lr | steps | reported (90%) | window steps "
        "| exact (last 10%) | exact (window) | in interval | previous rule | trend limit "
        "| line / power / step / loss |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        r = o.run
        steps = f"{o.steps_run:,}" + (" (diverged)" if o.diverged else "")
        window = f"{count(o.window_steps[0])}–{count(o.window_steps[1])}" if o.window_steps else "—"
        covered = {True: "yes", False: "no", None: "—"}[
            o.covered if o.number is not None else o.bound_holds
        ]
        task = r.task + (f" (seed {r.seed})" if r.seed else "")
        lines.append(
            f"| {task} | {r.optimizer} | {r.batch_size} | {r.lr:g} | {steps} | {_reported(o)} "
            f"| {window} | {count(o.exact_last)} | "
            f"{count(o.exact_window) if o.exact_window is not None else '—'} | {covered} | "
            f"{count(o.previous) if o.previous is not None else '—'} | {_limit(o.limits)} "
            f"| {_models(o.models)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.current_truth", description=__doc__)
    p.add_argument("--quick", action="store_true", help="the CI-sized study (digits only)")
    p.add_argument("--docs", type=Path, default=Path("docs"), help="reproduction.md's folder")
    p.add_argument(
        "--cache",
        type=Path,
        default=Path("experiments/runs/current_truth"),
        help="traces of trained runs, reused when the run and the measurement match",
    )
    args = p.parse_args(argv)
    command = "python -m experiments.current_truth" + (" --quick" if args.quick else "")
    outcomes = run_study(
        study_runs(args.quick) + ([] if args.quick else held_out_runs()),
        cache=args.cache,
        progress=lambda t: print(t, file=sys.stderr),
    )
    sections.write(args.docs / "reproduction.md", SECTION, render(outcomes, command))
    print(render(outcomes, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
