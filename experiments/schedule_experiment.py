"""Noise-scale-guided batch-size schedule vs fixed batch sizes.

``nice -n 10 python -m experiments.schedule_experiment [--task lsq|digits] [--repeats 5]
[--quick]`` trains, on one reproduction task (``experiments.tasks``), with fixed seeds:

1. every fixed batch size of the task's sweep with every learning rate of its grid, ``repeats``
   times (seeds 0..repeats-1 for the initialisation and the batch sampler); per batch size the
   learning rate with the fewest median steps to the target (all repeats must reach it);
2. ``noisescope.schedule.BatchSizeScheduler``: starts at the smallest batch, grows the batch
   (micro-batches of the task's granularity) toward B_simple, linear learning-rate rule capped at
   the best learning rate of the largest fixed batch; its base learning rate is tuned on the same
   grid by the same rule.

For each loss target it reports steps and examples to the target (median and min-max over
repeats) for the schedule, the best fixed *small* batch (fewest examples) and the best fixed
*large* batch (fewest steps), and where the schedule sits against the fixed-batch frontier
(S/S_min - 1)(E/E_min - 1) = 1 fitted with ``estimators.fit_critical_batch`` (a product below 1
means the schedule beats every fixed batch size, which a fixed-batch model cannot do).

Cached per run under ``experiments/runs/schedule/<task>/``; writes the markdown table to
``<out>/<task>.md`` and the figure to ``docs/figures/adaptive_batch_<task>.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiments.tasks import TASKS, TaskSpec, make_trainer
from noisescope import _format
from noisescope.estimators import examples_ratio, fit_critical_batch, steps_ratio
from noisescope.schedule import BatchSizeScheduler

__all__ = ["main", "run_fixed", "run_schedule"]

DIVERGE_FACTOR = 3.0
EVAL_SPACING = 0.02  # evaluate every 2% of the steps so far (and at least every step early)


@dataclass
class Trace:
    """One training run: steps/examples at which each target was first reached."""

    reached: dict[float, tuple[int, float]] = field(default_factory=dict)
    diverged: bool = False
    steps: int = 0
    examples: float = 0.0
    batch: list[tuple[int, int, float | None, float]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "reached": {str(k): v for k, v in self.reached.items()},
            "diverged": self.diverged,
            "steps": self.steps,
            "examples": self.examples,
            "batch": self.batch,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Trace:
        t = cls(
            {float(k): (int(v[0]), float(v[1])) for k, v in d["reached"].items()},
            d["diverged"],
            d["steps"],
            d["examples"],
            [tuple(x) for x in d["batch"]],
        )
        return t


def _train(
    spec: TaskSpec,
    seed: int,
    targets: Sequence[float],
    lr_of: Any,
    batch_of: Any,
    observe: _Observer | None = None,
    record_every: int = 0,
    hook: Any = None,
) -> Trace:
    """``hook(step, trainer)``, before each step, returns the examples it spent on the side
    (branch runs); they count toward the run's examples."""
    trainer = make_trainer(spec, seed=seed, sampler_seed=10_000 + seed)
    loss0 = trainer.eval_loss()
    trace = Trace()
    pending = sorted(targets, reverse=True)
    next_eval = 1
    examples = 0.0
    step = 0
    while pending and step < spec.max_steps and examples < spec.max_examples:
        if hook is not None:
            examples += hook(step, trainer)
        batch = batch_of()
        res = trainer.step(batch, lr_of())
        step += 1
        examples += batch
        if observe is not None:
            observe(step, res)
        if record_every and step % record_every == 0:
            truth = trainer.truth().get("b_simple_true")
            noise_scale = observe.noise_scale if observe is not None else None
            trace.batch.append((step, batch, noise_scale, truth or 0.0))
        if step >= next_eval:
            next_eval = step + max(1, int(EVAL_SPACING * step))
            loss = trainer.eval_loss()
            if not math.isfinite(loss) or loss > DIVERGE_FACTOR * loss0:
                trace.diverged = True
                break
            while pending and loss <= pending[0]:
                trace.reached[pending.pop(0)] = (step, examples)
    trace.steps, trace.examples = step, examples
    return trace


def run_fixed(spec: TaskSpec, batch: int, lr: float, seed: int, targets: Sequence[float]) -> Trace:
    return _train(spec, seed, targets, lambda: lr, lambda: batch)


class _Observer:
    def __init__(self, sched: BatchSizeScheduler) -> None:
        self.sched = sched

    def __call__(self, step: int, res: Any) -> None:
        self.sched.observe_norms(step, res.b_small, res.b_big, res.g_small_sq, res.g_big_sq)

    @property
    def noise_scale(self) -> float | None:
        return self.sched.noise_scale


#: Scheduler settings compared. "default": the library defaults (EMA horizon ~50 steps, 50
#: warm-up and cool-down steps, sized for runs of thousands of steps). "fast": the same rule
#: with a ~10-step horizon, for runs that reach their targets in a few hundred steps.
#: "fast-sqrt": "fast" with the square-root learning-rate rule (an ablation of the lr rule).
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "fast": {"warmup_steps": 10, "cooldown_steps": 10},
    "fast-sqrt": {"warmup_steps": 10, "cooldown_steps": 10, "lr_rule": "sqrt"},
    # Follows the branch-measured local critical batch size instead of B_simple
    # (experiments.branching.branch_hook): no B_simple, no warm-up or cool-down.
    "branch": {"warmup_steps": 0, "cooldown_steps": 0},
}


def make_scheduler(
    spec: TaskSpec, base_lr: float, max_lr: float, variant: str = "default"
) -> BatchSizeScheduler:
    """The schedule under test: library defaults except the batch range and ``VARIANTS``."""
    granularity = spec.micro_batches  # the task splits each batch into this many micro-batches
    settings: dict[str, Any] = {"lr_rule": "linear", **VARIANTS[variant]}
    return BatchSizeScheduler(
        micro_batch_size=granularity,
        min_batch_size=max(spec.batch_sizes[0], granularity),
        max_batch_size=spec.batch_sizes[-1],
        base_lr=base_lr,
        max_lr=max_lr,
        **settings,
    )


def run_schedule(
    spec: TaskSpec,
    base_lr: float,
    max_lr: float,
    seed: int,
    targets: Sequence[float],
    variant: str = "default",
) -> Trace:
    sched = make_scheduler(spec, base_lr, max_lr, variant)
    lr_of = lambda: sched.lr  # noqa: E731
    if variant == "branch":
        import tempfile

        from experiments.branching import branch_hook

        with tempfile.TemporaryDirectory() as store:
            hook = branch_hook(spec, sched, Path(store))
            return _train(spec, seed, targets, lr_of, lambda: sched.batch_size, hook=hook)
    obs = _Observer(sched)
    return _train(spec, seed, targets, lr_of, lambda: sched.batch_size, obs, record_every=10)


def _cached(path: Path, compute: Any) -> Trace:
    if path.exists():
        return Trace.from_json(json.loads(path.read_text()))
    trace: Trace = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(trace.to_json()))
    tmp.replace(path)
    return trace


def _median_or_none(values: list[float | None]) -> float | None:
    if not values or any(v is None for v in values):
        return None
    return statistics.median(v for v in values if v is not None)


def _best_lr(
    traces: dict[float, list[Trace]], target: float
) -> tuple[float, list[tuple[int, float]]] | None:
    """The lr whose repeats all reached ``target`` with the fewest median steps."""
    best: tuple[float, float, list[tuple[int, float]]] | None = None
    for lr, runs in traces.items():
        hits = [r.reached.get(target) for r in runs]
        if any(h is None for h in hits):
            continue
        got = [h for h in hits if h is not None]
        med = statistics.median(h[0] for h in got)
        if best is None or med < best[1]:
            best = (lr, med, got)
    return None if best is None else (best[0], best[2])


def _stats(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.schedule_experiment")
    p.add_argument("--task", default="lsq", choices=["lsq", "digits"])
    p.add_argument("--repeats", type=int, default=None, help="default: 5 (2 with --quick)")
    p.add_argument("--quick", action="store_true", help="the task's quick sweep, 2 repeats")
    p.add_argument("--out", type=Path, default=Path("experiments/runs/schedule"))
    p.add_argument("--figure", type=Path, default=None)
    p.add_argument(
        "--targets", default=None, help="comma-separated loss targets (default: the task's)"
    )
    p.add_argument("--variants", default="default,fast,fast-sqrt", help=f"of {', '.join(VARIANTS)}")
    args = p.parse_args(argv)
    spec = TASKS[args.task].sized(args.quick)
    repeats = args.repeats or (2 if args.quick else 5)
    targets = (
        tuple(float(t) for t in args.targets.split(",")) if args.targets else spec.loss_targets
    )
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            p.error(f"unknown variant {v!r}; choose from {', '.join(VARIANTS)}")
    lowest = min(targets)
    tag = "_".join(f"{t:g}" for t in sorted(targets, reverse=True))
    out = args.out / ("quick" if args.quick else "full") / f"{spec.name}_targets_{tag}"
    t0 = time.monotonic()
    seeds = list(range(repeats))

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - t0:6.0f}s] {msg}", file=sys.stderr, flush=True)

    # 1. fixed batch sizes x learning rates x seeds
    fixed: dict[int, dict[float, list[Trace]]] = {}
    for b in spec.batch_sizes:
        fixed[b] = {}
        for lr in spec.lrs:
            fixed[b][lr] = [
                _cached(
                    out / f"fixed_B{b}_lr{lr:g}_s{s}.json",
                    lambda b=b, lr=lr, s=s: run_fixed(spec, b, lr, s, targets),
                )
                for s in seeds
            ]
        log(f"fixed B={b} done")
    # 2. the schedule: base lr over the same grid, cap = best lr of the largest fixed batch
    b_max = spec.batch_sizes[-1]
    cap = _best_lr(fixed[b_max], lowest) or _best_lr(fixed[b_max], max(targets))
    max_lr = cap[0] if cap is not None else max(spec.lrs)
    scheds: dict[str, dict[float, list[Trace]]] = {}
    for variant in variants:
        scheds[variant] = {}
        for lr in spec.lrs:
            if lr > max_lr:
                continue  # base lr above the cap would be capped from the first step
            scheds[variant][lr] = [
                _cached(
                    out / f"sched_{variant}_lr{lr:g}_cap{max_lr:g}_s{s}.json",
                    lambda lr=lr, s=s, v=variant: run_schedule(spec, lr, max_lr, s, targets, v),
                )
                for s in seeds
            ]
        log(f"schedule {variant} done")

    rows: list[dict[str, Any]] = []
    for target in targets:
        per_b: dict[int, tuple[float, list[tuple[int, float]]]] = {}
        for b in spec.batch_sizes:
            best = _best_lr(fixed[b], target)
            if best is not None:
                per_b[b] = best
        if len(per_b) < 3:
            rows.append({"target": target, "missing": True})
            continue
        med_steps = {b: statistics.median(h[0] for h in v[1]) for b, v in per_b.items()}
        med_ex = {b: statistics.median(h[1] for h in v[1]) for b, v in per_b.items()}
        small = min(per_b, key=lambda b: (med_ex[b], b))
        large = min(per_b, key=lambda b: (med_steps[b], -b))
        bs = sorted(per_b)
        # The frontier product needs the hyperbola: no B_crit (S_min or E_min <= 0), no product.
        fit = fit_critical_batch(bs, [med_steps[b] for b in bs])
        nan = float("nan")
        b_crit = nan if fit.b_crit is None else fit.b_crit
        s_min, e_min = (nan, nan) if fit.b_crit is None else (fit.s_min, fit.e_min)
        row: dict[str, Any] = {
            "target": target,
            "fixed": {
                str(b): {
                    "lr": per_b[b][0],
                    "steps": _stats([float(h[0]) for h in per_b[b][1]]),
                    "examples": _stats([h[1] for h in per_b[b][1]]),
                }
                for b in bs
            },
            "small": small,
            "large": large,
            "s_min": s_min,
            "e_min": e_min,
            "b_crit": b_crit,
            "b_crit_lo": fit.b_crit_lo,
            "b_crit_hi": fit.b_crit_hi,
            "b_crit_level": fit.level,
            "b_crit_reason": fit.reason,
            "schedules": {},
        }
        for variant, sched in scheds.items():
            s_best = _best_lr(sched, target)
            if s_best is None:
                continue
            sched_steps = [float(h[0]) for h in s_best[1]]
            sched_ex = [h[1] for h in s_best[1]]
            entry: dict[str, Any] = {
                "base_lr": s_best[0],
                "max_lr": max_lr,
                "steps": _stats(sched_steps),
                "examples": _stats(sched_ex),
            }
            if math.isfinite(s_min):
                s_rel = statistics.median(sched_steps) / s_min
                e_rel = statistics.median(sched_ex) / e_min
                entry["frontier_product"] = (s_rel - 1.0) * (e_rel - 1.0)
                entry["steps_over_min"] = s_rel
                entry["examples_over_min"] = e_rel
            row["schedules"][variant] = entry
        if math.isfinite(b_crit):
            # a fixed batch at B_crit costs 2x the minimum steps and 2x the minimum examples
            row["at_b_crit"] = [steps_ratio(b_crit, b_crit), examples_ratio(b_crit, b_crit)]
        rows.append(row)
    # each schedule's batch trajectory at its chosen base lr (seed 0), for the figure
    trajectories: dict[str, list[Any]] = {}
    for variant, sched in scheds.items():
        chosen = _best_lr(sched, lowest)
        trajectories[variant] = sched[chosen[0]][0].batch if chosen is not None else []
    result = {
        "task": spec.name,
        "targets": list(targets),
        "repeats": repeats,
        "quick": args.quick,
        "variants": {v: VARIANTS[v] for v in variants},
        "rows": rows,
        "trajectories": trajectories,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, indent=1))
    table = markdown(result, spec)
    (out / "result.md").write_text(table)
    print(table)
    figure = args.figure or (
        Path("docs/figures") / f"adaptive_batch_{spec.name}.png"
        if not args.quick
        else out / "figure.png"
    )
    try:
        save_figure(result, figure)
        log(f"figure written to {figure}")
    except Exception as exc:  # the table is the result; a figure failure is reported
        log(f"figure not written: {exc!r}")
    log("done")
    return 0


def _fmt(s: dict[str, float]) -> str:
    """A count's median [min–max] as the dashboard writes counts ("15,872", never "1.587e+04")."""
    return f"{_format.count(s['median'])} [{_format.count(s['min'])}–{_format.count(s['max'])}]"


def markdown(result: dict[str, Any], spec: TaskSpec) -> str:
    lines = [
        f"Task `{spec.name}` ({spec.title}), {result['repeats']} repeats (seeds 0–"
        f"{result['repeats'] - 1}); median [min–max] over repeats; learning rate tuned per "
        "fixed batch and per schedule variant on the same grid (fewest median steps).",
        "",
    ]
    for variant, settings in result["variants"].items():
        lines += [
            f"Schedule variant `{variant}` ({settings or 'library defaults'}):",
            "",
            "| loss target | schedule steps | best small B: steps | schedule examples | "
            "best large B: examples | fewer steps than small? | fewer examples than large? | "
            "S/S_min, E/E_min | (S/S_min−1)(E/E_min−1) | fixed B with fewer steps AND examples |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in result["rows"]:
            sc = row.get("schedules", {}).get(variant)
            if row.get("missing") or sc is None:
                lines.append(f"| {row['target']:g} | not reached by all repeats | | | | | | | | |")
                continue
            small = row["fixed"][str(row["small"])]
            large = row["fixed"][str(row["large"])]
            win_s = sc["steps"]["median"] < small["steps"]["median"]
            win_e = sc["examples"]["median"] < large["examples"]["median"]
            rel = (
                f"{sc['steps_over_min']:.2f}, {sc['examples_over_min']:.2f}"
                if "steps_over_min" in sc
                else "n/a"
            )
            prod = f"{sc['frontier_product']:.2f}" if "frontier_product" in sc else "n/a"
            dominating = [
                b
                for b, f in row["fixed"].items()
                if f["steps"]["median"] <= sc["steps"]["median"]
                and f["examples"]["median"] <= sc["examples"]["median"]
            ]
            dom = ", ".join(f"B={b}" for b in dominating) or "none"
            lines.append(
                f"| {row['target']:g} | {_fmt(sc['steps'])} "
                f"| {_fmt(small['steps'])} (B={row['small']}) "
                f"| {_fmt(sc['examples'])} | {_fmt(large['examples'])} (B={row['large']}) "
                f"| {'yes' if win_s else 'no'} | {'yes' if win_e else 'no'} | {rel} | {prod} "
                f"| {dom} |"
            )
        lines.append("")
    lines.append(
        "Fixed-batch frontier per target (best lr per B; fit S = S_min(1 + B_crit/B)): "
        + "; ".join(_frontier_fit(r) for r in result["rows"] if not r.get("missing"))
    )
    return "\n".join(lines) + "\n"


def _frontier_fit(row: dict[str, Any]) -> str:
    """S_min, E_min and B_crit with its Fieller interval, or why there is no B_crit."""
    head = f"L={row['target']:g}: "
    if not math.isfinite(row["b_crit"]):
        return head + f"no B_crit ({row.get('b_crit_reason')})"
    lo, hi = row.get("b_crit_lo"), row.get("b_crit_hi")
    level = row.get("b_crit_level", 0.9)
    interval = (
        f" [{_format.count(lo)}–{_format.count(hi)}, {level:.0%}]"
        if lo is not None and hi is not None
        else f" (interval unbounded at {level:.0%})"
    )
    return (
        head + f"S_min={_format.count(row['s_min'])}, E_min={_format.count(row['e_min'])}, "
        f"B_crit={_format.count(row['b_crit'])}{interval}"
    )


def _point(target: float, who: str, label: str, stats: dict[str, Any]) -> dict[str, Any]:
    return {
        "target": f"loss {target:g}",
        "who": who,
        "label": label,
        "steps": stats["steps"]["median"],
        "steps_lo": stats["steps"]["min"],
        "steps_hi": stats["steps"]["max"],
        "examples": stats["examples"]["median"],
        "examples_lo": stats["examples"]["min"],
        "examples_hi": stats["examples"]["max"],
    }


def save_figure(result: dict[str, Any], path: Path) -> None:
    import altair as alt
    import pandas as pd

    points: list[dict[str, Any]] = []
    for row in result["rows"]:
        if row.get("missing"):
            continue
        for b, f in row["fixed"].items():
            points.append(_point(row["target"], "fixed batch", f"B={b}", f))
        for variant, sc in row["schedules"].items():
            points.append(_point(row["target"], f"schedule ({variant})", variant, sc))
    whos = ["fixed batch"] + [f"schedule ({v})" for v in result["variants"]]
    palette = ["#7f7f7f", "#d62728", "#1f77b4", "#2ca02c"][: len(whos)]
    color = alt.Color(
        "who:N",
        title=None,
        scale=alt.Scale(domain=whos, range=palette),
        legend=alt.Legend(orient="bottom"),
    )
    base = alt.Chart(pd.DataFrame(points))
    dots = base.mark_point(filled=True, size=50).encode(
        x=alt.X("examples:Q", scale=alt.Scale(type="log"), title="examples to target"),
        y=alt.Y("steps:Q", scale=alt.Scale(type="log"), title="optimizer steps to target"),
        color=color,
        tooltip=["label:N", "steps:Q", "examples:Q"],
    )
    ybars = base.mark_rule().encode(x="examples:Q", y="steps_lo:Q", y2="steps_hi:Q", color=color)
    xbars = base.mark_rule().encode(x="examples_lo:Q", x2="examples_hi:Q", y="steps:Q", color=color)
    text = (
        base.transform_filter(alt.datum.who == "fixed batch")
        .mark_text(dx=16, dy=-6, fontSize=9)
        .encode(x="examples:Q", y="steps:Q", text="label:N", color=color)
    )
    frontier = (
        alt.layer(ybars, xbars, dots, text)
        .properties(width=210, height=190)
        .facet(facet=alt.Facet("target:N", title=None, sort=None), columns=3)
        .resolve_scale(x="independent", y="independent")
    )
    traj: list[dict[str, Any]] = []
    for variant, rows in result["trajectories"].items():
        traj += [
            {"step": s, "series": f"batch size, schedule ({variant})", "value": b}
            for s, b, _, _ in rows
        ]
        traj += [
            {"step": s, "series": f"B_simple now, scheduler ({variant})", "value": n}
            for s, _, n, _ in rows
            if n
        ]
    first: list[Any] = next(iter(result["trajectories"].values()), [])
    traj += [
        {"step": s, "series": "B_simple, closed form", "value": t} for s, _, _, t in first if t
    ]
    lines = (
        alt.Chart(pd.DataFrame(traj))
        .mark_line()
        .encode(
            x=alt.X("step:Q", title="optimizer step"),
            y=alt.Y("value:Q", scale=alt.Scale(type="log"), title="examples"),
            color=alt.Color("series:N", title=None, legend=alt.Legend(orient="bottom")),
        )
        .properties(width=520, height=200, title="Batch size chosen by the schedules (seed 0)")
    )
    chart = (
        alt.vconcat(frontier, lines)
        .resolve_scale(color="independent")
        .properties(
            title=f"{result['task']}: noise-scale schedule vs fixed batch sizes "
            f"({result['repeats']} repeats; bars: min–max)"
        )
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    chart.save(str(path), ppi=80)


if __name__ == "__main__":
    sys.exit(main())
