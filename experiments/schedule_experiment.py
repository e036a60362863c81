"""Noise-scale-guided batch-size schedule vs fixed batch sizes (docs/adaptive_batch.md).

``python -m experiments.schedule_experiment --all --jobs 2 --page docs/adaptive_batch.md`` runs
the page's study (``STUDY``: each task with its targets and grid); ``--task T`` one task. With
fixed seeds, on a reproduction task (``experiments.tasks``) it trains:

1. every fixed batch size of the task's sweep with every learning rate of its grid, ``repeats``
   times (seeds 0..repeats-1 for the initialisation and the batch sampler); per batch size and
   target the learning rate with the fewest median steps (all repeats must reach it): the
   frontier;
2. ``noisescope.schedule.BatchSizeScheduler`` in each of ``VARIANTS``: starts at the smallest
   batch and grows by micro-batches of the task's granularity; ``max_lr`` is the best learning
   rate of the largest fixed batch, the base learning rate is tuned on the same grid;
3. the control: every fixed batch under the noise learning-rate rule.

Per loss target it reports steps and examples (median and min-max over repeats), where the
schedule lies against the hyperbola (S/S_min - 1)(E/E_min - 1) = 1 fitted to the frontier with
``estimators.fit_critical_batch`` (below 1: inside, which no fixed batch of the model reaches),
the fixed batches at least as good on both counts, and those whose seeds' ranges overlap it.

Runs are cached under ``experiments/runs/schedule/``; the tables go to ``result.md`` there and,
with ``--page``, into the page's section ``schedule-<task>`` with the figure
(``docs/figures/adaptive_batch_<task>.png``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from experiments import sections
from experiments._schedule_report import markdown, save_figure
from experiments.tasks import TASKS, TaskSpec, make_trainer
from noisescope.estimators import fit_critical_batch
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
    """Feeds each step's norms to the scheduler in its batch units: a task that measures in
    tokens reports b_small and b_big in tokens, while the batch counts sequences, and B_simple
    (linear in the b's, docs/science.md eq. 3-4) is then in tokens too."""

    def __init__(self, sched: BatchSizeScheduler, per_example: float = 1.0) -> None:
        self.sched = sched
        self.per_example = per_example

    def __call__(self, step: int, res: Any) -> None:
        b_small, b_big = res.b_small / self.per_example, res.b_big / self.per_example
        self.sched.observe_norms(step, b_small, b_big, res.g_small_sq, res.g_big_sq)

    @property
    def noise_scale(self) -> float | None:
        return self.sched.noise_scale


#: Scheduler settings compared. "default": the library defaults (the batch follows the current
#: B_simple; tuned base learning rate, linear in B up to ``max_lr``; 50 warm-up and cool-down
#: steps). "noise": the learning rate ε_max/(1 + B_simple/B) with ε_max = ``max_lr``.
#: "noise-sqrt": that, with the batch following √(B_simple · B_ref). "noise-lr-only": the noise
#: rule with the batch held at the smallest one (what the learning-rate rule alone buys).
#: "fast" and "fast-sqrt": the linear and square-root rules with 10-step warm-up and cool-down.
#: "branch": follows the branch-measured local critical batch size
#: (experiments.branching.branch_hook) instead of B_simple.
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "noise": {"lr_rule": "noise"},
    "noise-sqrt": {"lr_rule": "noise", "policy": "sqrt"},
    "noise-lr-only": {"lr_rule": "noise", "grows": False},
    "fast": {"warmup_steps": 10, "cooldown_steps": 10, "lr_rule": "linear"},
    "fast-sqrt": {"warmup_steps": 10, "cooldown_steps": 10, "lr_rule": "sqrt"},
    "branch": {"warmup_steps": 0, "cooldown_steps": 0, "lr_rule": "linear"},
}

#: The study of docs/adaptive_batch.md (``--all``): per task, the settings its section ran with.
STUDY: dict[str, list[str]] = {
    "lsq": ["--repeats", "3", "--targets", "1,0.75,0.6,0.55"],
    "digits": ["--repeats", "3", "--targets", "1,0.5,0.3,0.2"],
    "charlm": [
        *("--repeats", "3", "--targets", "2.3,2,1.8,1.6"),
        *("--batch-sizes", "4,8,16,32,64", "--lrs", "0.008,0.004,0.002"),
    ],
}

#: The control: every fixed batch under this variant's learning-rate rule.
CONTROL_VARIANT = "noise"


def make_scheduler(
    spec: TaskSpec,
    base_lr: float,
    max_lr: float,
    variant: str = "default",
    *,
    batch: int | None = None,
) -> BatchSizeScheduler:
    """The schedule under test: library defaults except the batch range and ``VARIANTS``;
    ``batch`` holds the batch there (the learning-rate rule alone, at a fixed batch)."""
    granularity = spec.micro_batches  # the task splits each batch into this many micro-batches
    settings: dict[str, Any] = dict(VARIANTS[variant])
    min_batch = batch or max(spec.batch_sizes[0], granularity)
    grows = settings.pop("grows", True) and batch is None
    return BatchSizeScheduler(
        micro_batch_size=granularity,
        min_batch_size=min_batch,
        max_batch_size=spec.batch_sizes[-1] if grows else min_batch,
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
    *,
    batch: int | None = None,
) -> Trace:
    sched = make_scheduler(spec, base_lr, max_lr, variant, batch=batch)
    lr_of = lambda: sched.lr  # noqa: E731
    if variant == "branch":
        import tempfile

        from experiments.branching import branch_hook

        with tempfile.TemporaryDirectory() as store:
            hook = branch_hook(spec, sched, Path(store))
            return _train(spec, seed, targets, lr_of, lambda: sched.batch_size, hook=hook)
    obs = _Observer(sched, spec.tokens_per_example)
    return _train(spec, seed, targets, lr_of, lambda: sched.batch_size, obs, record_every=10)


@dataclass(frozen=True)
class _Job:
    """One training run, picklable for a worker process: a fixed batch (``variant`` None) or
    a schedule variant (at a held ``batch`` for the control)."""

    path: Path
    spec: TaskSpec
    seed: int
    targets: tuple[float, ...]
    lr: float
    batch: int | None = None
    variant: str | None = None
    max_lr: float = 0.0

    def run(self) -> None:
        if self.variant is None:
            assert self.batch is not None
            trace = run_fixed(self.spec, self.batch, self.lr, self.seed, self.targets)
        else:
            trace = run_schedule(
                self.spec,
                self.lr,
                self.max_lr,
                self.seed,
                self.targets,
                self.variant,
                batch=self.batch,
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(trace.to_json()))
        tmp.replace(self.path)


def _run_all(jobs: list[_Job], workers: int, log: Any) -> dict[Path, Trace]:
    """Every job's trace: the cached ones read, the others run on ``workers`` processes."""
    todo = [job for job in jobs if not job.path.exists()]
    if todo:
        log(f"{len(todo)} of {len(jobs)} runs to train on {workers} process(es)")
    for done, _ in enumerate(_train_each(todo, workers), 1):
        if done % max(1, len(todo) // 20) == 0 or done == len(todo):
            log(f"  {done}/{len(todo)} runs trained")
    return {job.path: Trace.from_json(json.loads(job.path.read_text())) for job in jobs}


def _train_each(todo: list[_Job], workers: int) -> Iterator[None]:
    """Runs the jobs, in this process or on a pool, yielding as each one finishes."""
    if workers > 1 and len(todo) > 1:
        with ProcessPoolExecutor(workers) as pool:
            for future in as_completed([pool.submit(job.run) for job in todo]):
                future.result()  # a worker's exception surfaces here
                yield
    else:
        for job in todo:
            job.run()
            yield


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


def _frontier(traces: dict[int, dict[float, list[Trace]]], target: float) -> dict[str, Any] | None:
    """Per batch size its best learning rate's steps and examples to ``target``, and the
    hyperbola S = S_min(1 + B_crit/B) fitted to them (None with fewer than 3 batch sizes)."""
    per_b = {b: best for b in traces if (best := _best_lr(traces[b], target)) is not None}
    if len(per_b) < 3:
        return None
    med_steps = {b: statistics.median(h[0] for h in v[1]) for b, v in per_b.items()}
    med_ex = {b: statistics.median(h[1] for h in v[1]) for b, v in per_b.items()}
    bs = sorted(per_b)
    # The frontier product needs the hyperbola: no B_crit (S_min or E_min <= 0), no product.
    fit = fit_critical_batch(bs, [med_steps[b] for b in bs])
    nan = float("nan")
    return {
        "fixed": {
            str(b): {
                "lr": per_b[b][0],
                "steps": _stats([float(h[0]) for h in per_b[b][1]]),
                "examples": _stats([h[1] for h in per_b[b][1]]),
            }
            for b in bs
        },
        "small": min(per_b, key=lambda b: (med_ex[b], b)),
        "large": min(per_b, key=lambda b: (med_steps[b], -b)),
        "s_min": nan if fit.b_crit is None else fit.s_min,
        "e_min": nan if fit.b_crit is None else fit.e_min,
        "b_crit": nan if fit.b_crit is None else fit.b_crit,
        "b_crit_lo": fit.b_crit_lo,
        "b_crit_hi": fit.b_crit_hi,
        "b_crit_level": fit.level,
        "b_crit_reason": fit.reason,
    }


def _against(entry: dict[str, Any], frontier: dict[str, Any]) -> dict[str, Any]:
    """Where a schedule stands against a fixed-batch frontier: its place on the fitted
    hyperbola, the fixed batches at least as good on both counts (medians), and the fixed
    batches whose seeds' ranges overlap the schedule's on steps and on examples alike."""
    steps, examples = entry["steps"], entry["examples"]
    out: dict[str, Any] = {
        "dominated_by": [
            int(b)
            for b, f in frontier["fixed"].items()
            if f["steps"]["median"] <= steps["median"]
            and f["examples"]["median"] <= examples["median"]
        ],
        "overlaps": [
            int(b)
            for b, f in frontier["fixed"].items()
            if _overlap(f["steps"], steps) and _overlap(f["examples"], examples)
        ],
    }
    if math.isfinite(frontier["s_min"]):
        s_rel = steps["median"] / frontier["s_min"]
        e_rel = examples["median"] / frontier["e_min"]
        out.update(
            steps_over_min=s_rel,
            examples_over_min=e_rel,
            frontier_product=(s_rel - 1.0) * (e_rel - 1.0),
        )
    return out


def _overlap(a: dict[str, float], b: dict[str, float]) -> bool:
    return a["min"] <= b["max"] and b["min"] <= a["max"]


def _stats(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.schedule_experiment")
    p.add_argument("--task", default="lsq", choices=sorted(TASKS))
    p.add_argument("--repeats", type=int, default=None, help="default: 5 (2 with --quick)")
    p.add_argument("--quick", action="store_true", help="the task's quick sweep, 2 repeats")
    p.add_argument("--out", type=Path, default=Path("experiments/runs/schedule"))
    p.add_argument("--figure", type=Path, default=None)
    p.add_argument(
        "--targets", default=None, help="comma-separated loss targets (default: the task's)"
    )
    p.add_argument(
        "--control",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run every fixed batch under the noise learning-rate rule",
    )
    p.add_argument(
        "--page",
        type=Path,
        default=None,
        help="rewrite this page's section schedule-TASK with the command, tables and figure "
        "(docs/adaptive_batch.md)",
    )
    p.add_argument("--jobs", type=int, default=1, help="training processes (default 1)")
    p.add_argument("--batch-sizes", default=None, help="comma-separated (default: the task's)")
    p.add_argument("--lrs", default=None, help="comma-separated (default: the task's grid)")
    p.add_argument(
        "--variants",
        default="default,noise,noise-sqrt,noise-lr-only",
        help=f"of {', '.join(VARIANTS)}",
    )
    p.add_argument(
        "--all",
        action="store_true",
        help="the study of docs/adaptive_batch.md: every task of STUDY with its settings "
        "(--jobs and --page pass through)",
    )
    args = p.parse_args(argv)
    if args.all:
        common = ["--jobs", str(args.jobs)] + (["--page", str(args.page)] if args.page else [])
        return max(main(["--task", task, *settings, *common]) for task, settings in STUDY.items())
    spec = TASKS[args.task].sized(args.quick)
    if args.batch_sizes:
        spec = replace(spec, batch_sizes=tuple(sorted(int(b) for b in args.batch_sizes.split(","))))
    if args.lrs:
        spec = replace(spec, lrs=tuple(float(lr) for lr in args.lrs.split(",")))
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
    if args.batch_sizes or args.lrs:  # another grid: another cache
        tag += "_grid_" + "_".join(f"{x:g}" for x in (*spec.batch_sizes, *spec.lrs))
    out = args.out / ("quick" if args.quick else "full") / f"{spec.name}_targets_{tag}"
    t0 = time.monotonic()
    seeds = list(range(repeats))

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - t0:6.0f}s] {msg}", file=sys.stderr, flush=True)

    # 1. fixed batch sizes x learning rates x seeds
    def fixed_job(b: int, lr: float, s: int) -> _Job:
        return _Job(out / f"fixed_B{b}_lr{lr:g}_s{s}.json", spec, s, targets, lr, batch=b)

    done = _run_all(
        [fixed_job(b, lr, s) for b in spec.batch_sizes for lr in spec.lrs for s in seeds],
        args.jobs,
        log,
    )
    fixed = {
        b: {lr: [done[fixed_job(b, lr, s).path] for s in seeds] for lr in spec.lrs}
        for b in spec.batch_sizes
    }
    # 2. the schedule: base lr over the same grid, cap = best lr of the largest fixed batch;
    # 3. the control: every fixed batch under the noise learning-rate rule
    b_max = spec.batch_sizes[-1]
    cap = _best_lr(fixed[b_max], lowest) or _best_lr(fixed[b_max], max(targets))
    max_lr = cap[0] if cap is not None else max(spec.lrs)
    base_lrs = [lr for lr in spec.lrs if lr <= max_lr]  # above the cap: capped from step one

    def sched_job(variant: str, lr: float, s: int) -> _Job:
        name = f"sched_{variant}_lr{lr:g}_cap{max_lr:g}_s{s}.json"
        return _Job(out / name, spec, s, targets, lr, variant=variant, max_lr=max_lr)

    def control_job(b: int, lr: float, s: int) -> _Job:
        name = f"fixednoise_B{b}_lr{lr:g}_cap{max_lr:g}_s{s}.json"
        return _Job(out / name, spec, s, targets, lr, b, CONTROL_VARIANT, max_lr)

    held = [b for b in spec.batch_sizes if b % spec.micro_batches == 0] if args.control else []
    done = _run_all(
        [sched_job(v, lr, s) for v in variants for lr in base_lrs for s in seeds]
        + [control_job(b, lr, s) for b in held for lr in base_lrs for s in seeds],
        args.jobs,
        log,
    )
    scheds = {
        v: {lr: [done[sched_job(v, lr, s).path] for s in seeds] for lr in base_lrs}
        for v in variants
    }
    fixed_noise = {
        b: {lr: [done[control_job(b, lr, s).path] for s in seeds] for lr in base_lrs} for b in held
    }

    rows: list[dict[str, Any]] = []
    for target in targets:
        frontier = _frontier(fixed, target)
        if frontier is None:
            rows.append({"target": target, "missing": True})
            continue
        row: dict[str, Any] = {"target": target, **frontier, "schedules": {}}
        control = _frontier(fixed_noise, target) if fixed_noise else None
        if control is not None:
            row["control"] = control
        for variant, sched in scheds.items():
            s_best = _best_lr(sched, target)
            if s_best is None:
                continue
            entry: dict[str, Any] = {
                "base_lr": s_best[0],
                "max_lr": max_lr,
                "steps": _stats([float(h[0]) for h in s_best[1]]),
                "examples": _stats([h[1] for h in s_best[1]]),
            }
            entry.update(_against(entry, frontier))
            if control is not None:
                entry["control"] = _against(entry, control)
            row["schedules"][variant] = entry
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
    if args.page is not None:
        command = " ".join(["python -m experiments.schedule_experiment", *(argv or sys.argv[1:])])
        link = Path(os.path.relpath(figure, args.page.parent)).as_posix()
        body = (
            f"```bash long\n{command}\n```\n\n{table}\n"
            f"![{spec.name}: schedule vs fixed batch sizes]({link})"
        )
        sections.write(args.page, f"schedule-{spec.name}", body)
        log(f"section schedule-{spec.name} of {args.page} rewritten")
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
