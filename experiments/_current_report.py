"""The current-truth study's report (``experiments.current_truth``): the acceptance figures
and the section of ``docs/reproduction.md``."""

from __future__ import annotations

import math
from collections.abc import Sequence

from experiments._current_outcome import DIVERGED_FACTOR, HELD_OUT_SEED, MICRO, RunOutcome
from experiments.current_limits import (
    LIMIT_FRACTIONS,
    MODEL_FRACTIONS,
    MODEL_WINDOWS,
    SHAPE_SMOOTHING,
    ModelAnswer,
    TrendLimit,
)
from experiments.current_tasks import TRUTH_EVERY, TRUTH_EVERY_RECENT, TRUTH_RECENT
from noisescope._format import count
from noisescope.estimators import CURRENT_MAX_FACTOR


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
