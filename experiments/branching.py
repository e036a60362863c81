"""``python -m experiments.branching [--tasks digits,charlm] [--out DIR] [--docs DIR]``.

Measures the local critical batch size by branching (``noisescope.branch``; Merrill et al.
2025) along one parent run per task, and sets it against B_simple measured by the same parent
run and against the task's batch-size sweep (``python -m experiments``' sweep, reused from its
cache or run) read at the parent's loss through the forecast B_crit(L) = B*·L^(−1/α_B)
(``noisescope.forecast``). The parent, every branch (linked to its parent and branch step) and
the sweep are logged to a local ``noisescope server``. Writes the section "Branching: the local
critical batch size" of ``docs/reproduction.md`` (only that section) and its figure.
"""

from __future__ import annotations

import argparse
import copy
import shlex
import sys
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from experiments import sections
from experiments._step import StepResult, measured_step
from experiments.tasks import TASKS, CharLM, DigitsMLP, TaskSpec

__all__ = ["BRANCH_TASKS", "BranchTask", "main"]

SECTION = "branching"


@dataclass(frozen=True, kw_only=True)
class BranchTask:
    """One parent run of a task and its branch points; sizes in the task's units. Its repr
    names the parent run and the branch store, so fields keep their order."""

    key: str
    task: str
    batch_size: int  # parent batch, in units (tokens for charlm)
    lr: float
    lr_rule: str
    steps: int  # parent run length
    branch_steps: tuple[int, ...]
    multipliers: tuple[int, ...] = (1, 2, 4, 8, 16)
    budget: int  # units per branch
    seeds: int = 3
    epsilon: float = 0.01


#: The lr rule decides much of what a branch sweep measures, so digits runs with two: linear
#: scaling (the SGD rule below B_crit) from a base lr whose x16 is still stable, and sqrt.
_DIGITS = BranchTask(
    key="digits",
    task="digits",
    batch_size=16,
    lr=0.1,
    lr_rule="linear",
    steps=700,
    branch_steps=(10, 40, 150, 600),
    budget=2048,
)
BRANCH_TASKS: dict[str, BranchTask] = {
    t.key: t
    for t in (
        _DIGITS,
        replace(_DIGITS, key="digits-sqrt", lr=0.2, lr_rule="sqrt"),
        BranchTask(
            key="charlm",
            task="charlm",
            batch_size=256,
            lr=2e-3,
            lr_rule="sqrt",
            steps=1200,
            branch_steps=(20, 100, 400, 1100),
            budget=32768,
        ),
    )
}


class _Branchable:
    """A task's trainer as a ``noisescope.branch.Branchable``: full state copies, paired data
    (seed j of every batch size trains on the same first examples of one stream)."""

    def __init__(self, spec: TaskSpec, trainer: Any) -> None:
        self.spec = spec
        self.trainer = trainer

    def save(self) -> Any:
        t = self.trainer
        return copy.deepcopy((t.model.state_dict(), t.opt.state_dict(), t.gen.get_state()))

    def restore(self, state: Any) -> None:
        model_state, opt_state, gen_state = copy.deepcopy(state)
        t = self.trainer
        t.model.load_state_dict(model_state)
        t.opt.load_state_dict(opt_state)
        t.gen.set_state(gen_state)

    def train(self, branch: Any, run: Any) -> None:
        tpe = self.spec.tokens_per_example
        per_step = branch.batch_size // tpe
        seed = zlib.crc32(f"{self.spec.name}-{branch.step}-{branch.seed}".encode())
        gen = torch.Generator().manual_seed(seed)
        n = branch.examples // tpe
        t = self.trainer
        high = len(t.y) if isinstance(t, DigitsMLP) else len(t.train) - t.context - 1
        draws = torch.randint(0, high, (n,), generator=gen)
        for i in range(branch.steps):
            res = step_on(t, draws[i * per_step : (i + 1) * per_step], branch.lr)
            if run is not None:
                run.log_sample(
                    i, res.b_small, res.b_big, res.g_small_sq, res.g_big_sq, loss=res.loss
                )

    def evaluate(self) -> float:
        return float(self.trainer.eval_loss())


#: Parent steps at which the branch-following schedule branches (geometric: the local critical
#: batch size moves fastest early), and its branch settings.
SCHEDULE_BRANCH_STEPS = (5, 20, 80, 320)
SCHEDULE_MULTIPLIERS = (1, 2, 4, 8, 16)
SCHEDULE_SEEDS = 2


def branch_hook(spec: TaskSpec, sched: Any, store: Path) -> Any:
    """For ``schedule_experiment``'s "branch" variant: at ``SCHEDULE_BRANCH_STEPS``, branch from
    the current state (batch and lr of the scheduler, its lr rule, 4 steps of the largest
    branch) and hand the local critical batch size (or its lower bound) to
    ``sched.update``; returns the examples the branches used (their cost)."""
    from noisescope import branch

    def hook(step: int, trainer: Any) -> float:
        if step not in SCHEDULE_BRANCH_STEPS:
            return 0.0
        batch = sched.batch_size
        plan = branch.plan(
            step=step,
            batch_size=batch,
            lr=sched.lr,
            multipliers=SCHEDULE_MULTIPLIERS,
            budget=batch * SCHEDULE_MULTIPLIERS[-1] * 4,
            lr_rule="sqrt" if sched.lr_rule == "sqrt" else "linear",
            seeds=SCHEDULE_SEEDS,
            epsilon=0.01,
        )
        result = branch.run(plan, _Branchable(spec, trainer), store / f"step{step}")
        local = result.local
        if local is not None:
            sched.update(step, local.b_crit if local.b_crit is not None else local.b_crit_lo)
        return float(len(plan.branches) * plan.budget)

    return hook


def step_on(trainer: Any, draws: torch.Tensor, lr: float) -> StepResult:
    """One measured step on the given examples (digits: indices; charlm: sequence starts)."""
    k = min(trainer.k, len(draws))
    m = len(draws) // k
    if isinstance(trainer, DigitsMLP):
        micro = [
            (
                lambda sl=draws[j * m : (j + 1) * m]: F.cross_entropy(
                    trainer.model(trainer.x[sl]), trainer.y[sl]
                )
            )
            for j in range(k)
        ]
        return measured_step(trainer.params, trainer.opt, lr, micro, float(m))
    assert isinstance(trainer, CharLM)
    offsets = torch.arange(trainer.context)
    x = trainer.train[draws[:, None] + offsets]
    y = trainer.train[draws[:, None] + offsets + 1]
    micro = [(lambda sl=slice(j * m, (j + 1) * m): trainer._loss(x[sl], y[sl])) for j in range(k)]
    return measured_step(trainer.params, trainer.opt, lr, micro, float(m * trainer.context))


@dataclass(frozen=True)
class BranchPoint:
    """One branch point of a parent run and the three measurements at it."""

    step: int
    loss: float
    sweep: Any  # noisescope.branch.BranchSweep
    b_simple: Any  # estimators.Interval | None
    b_simple_reason: str | None
    global_b_crit: Any  # forecast.CriticalBatchForecast | None


@dataclass(frozen=True)
class TaskBranches:
    spec: TaskSpec
    setup: BranchTask
    parent_id: str
    points: list[BranchPoint]
    law: Any  # forecast.CriticalBatchLaw | None
    law_note: str
    plateau: Any  # forecast.Plateau
    minutes: float
    b_simple_curve: list[tuple[int, float, float, float]]


#: B_simple at a branch point pools the parent's samples over steps s ± max(s/4, MIN_HALF_WINDOW).
MIN_HALF_WINDOW = 32


def _b_simple_near(
    step: int, g_sq: list[float], trace_sigma: list[float]
) -> tuple[Any, str | None]:
    from noisescope.estimators import interval_from_steps

    half = max(step // 4, MIN_HALF_WINDOW)
    lo, hi = max(0, step - half), min(len(g_sq), step + half + 1)
    iv = interval_from_steps(g_sq[lo:hi], trace_sigma[lo:hi], n_blocks=8)
    return iv.b_simple, iv.reason


def run_task(
    spec: TaskSpec, setup: BranchTask, out: Path, url: str, progress: Any, with_sweep: bool
) -> TaskBranches:
    """Train the parent run, branching at each branch point; then the sweep's B_crit."""
    import time

    import noisescope
    from experiments.runner import INIT_SEED, PROJECT
    from experiments.tasks import make_trainer
    from noisescope import branch, forecast
    from noisescope.estimators import two_batch_estimates

    t0 = time.monotonic()
    tag = f"{zlib.crc32(repr(setup).encode()):08x}"
    parent_id = f"branching-{setup.key}-{tag}"
    trainer = make_trainer(spec, INIT_SEED, zlib.crc32(f"parent-{tag}".encode()))
    wrapper = _Branchable(spec, trainer)
    tpe = spec.tokens_per_example
    spool = str(out / "spool")
    parent = noisescope.init(
        url,
        project=PROJECT,
        task=spec.name,
        name=f"branching parent {setup.key} B={setup.batch_size} {setup.lr_rule}",
        config={"branching": repr(setup)},
        batch_size=setup.batch_size,
        units=spec.units,
        run_id=parent_id,
        dir=spool,
        quiet=True,
    )
    log = branch.LogTo(
        PROJECT,
        spec.name,
        url,
        name=f"B={setup.batch_size}",
        init_kwargs={"dir": spool, "quiet": True},
    )
    g_sq: list[float] = []
    trace_sigma: list[float] = []
    pending: list[tuple[int, float, Any]] = []
    for step in range(setup.steps + 1):
        if step in setup.branch_steps:
            loss = trainer.eval_loss()
            parent.log(step, eval_loss=loss, examples=float(step * setup.batch_size))
            plan = branch.plan(
                step=step,
                batch_size=setup.batch_size,
                lr=setup.lr,
                multipliers=setup.multipliers,
                budget=setup.budget,
                lr_rule=setup.lr_rule,
                seeds=setup.seeds,
                epsilon=setup.epsilon,
                units=spec.units,
                parent_run_id=parent_id,
            )
            store = out / "branches" / f"{setup.key}-{tag}" / f"step{step}"
            result = branch.run(plan, wrapper, store, log=log)
            local = result.local
            progress.line(
                f"{setup.key} step {step} (loss {loss:.3g}): local B_crit "
                + (f"{local.b_crit:.3g}" if local and local.b_crit else "-")
                + (" (bracket)" if local and local.bracketed else "")
                + (
                    f" [{local.b_crit_lo:.3g}–{local.b_crit_hi:.3g}]"
                    if local and local.b_crit_lo is not None and local.b_crit_hi is not None
                    else ""
                )
                + (f" ({result.reused} branches reused)" if result.reused else "")
            )
            pending.append((step, loss, result))
        if step == setup.steps:
            break
        res = trainer.step(setup.batch_size // tpe, setup.lr)
        parent.log_sample(
            step, res.b_small, res.b_big, res.g_small_sq, res.g_big_sq, loss=res.loss, lr=setup.lr
        )
        g, s = two_batch_estimates(res.b_small, res.b_big, res.g_small_sq, res.g_big_sq)
        g_sq.append(g)
        trace_sigma.append(s)
    parent.log(setup.steps, eval_loss=trainer.eval_loss())
    parent.finish()

    law = None
    law_note = "no sweep (--no-sweep)"
    if with_sweep:
        from experiments import analysis
        from experiments.runner import ensure_logged, run_sweep

        records = run_sweep(spec, out, url, progress)
        ensure_logged(records, spec, url, out, progress)
        report = analysis.analyse(
            analysis.to_sweep_runs(records),
            spec.loss_targets,
            project=PROJECT,
            task=spec.name,
            units=spec.units,
        )
        law = forecast.law_from_report(report)
        determined = sum(t.determined for t in report.targets)
        law_note = (
            f"fewer than 3 of the sweep's {len(report.targets)} targets have a determined B_crit"
            if law is None
            else f"fitted to the sweep's {determined} determined targets "
            f"(losses {law.loss_min:g} to {law.loss_max:g})"
        )
    points = []
    for step, loss, result in pending:
        b_simple, reason = _b_simple_near(step, g_sq, trace_sigma)
        points.append(
            BranchPoint(step, loss, result, b_simple, reason, law.predict(loss) if law else None)
        )
    # numbers and brackets (both ends known) take part in the plateau; a lower bound does not
    locals_ = [
        p
        for p in points
        if p.sweep.local
        and (p.sweep.local.b_crit is not None or p.sweep.local.b_crit_hi is not None)
    ]
    flat = forecast.plateau(
        [p.step for p in locals_],
        [p.sweep.local.b_crit for p in locals_],
        [p.sweep.local.b_crit_lo for p in locals_],
        [p.sweep.local.b_crit_hi for p in locals_],
    )
    curve = []
    window = 32
    for start in range(0, len(g_sq) - window + 1, window // 2):
        iv = _b_simple_near(start + window // 2, g_sq, trace_sigma)[0]
        if iv is not None:
            curve.append((start + window // 2, iv.value, iv.lo, iv.hi))
    return TaskBranches(
        spec, setup, parent_id, points, law, law_note, flat, (time.monotonic() - t0) / 60, curve
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.branching", description=__doc__)
    p.add_argument(
        "--tasks",
        default=",".join(BRANCH_TASKS),
        help=f"comma-separated, from {', '.join(BRANCH_TASKS)} (default: all)",
    )
    p.add_argument("--out", type=Path, default=Path("experiments/runs"), help="caches and server")
    p.add_argument("--docs", type=Path, default=Path("docs"), help="reproduction.md's folder")
    p.add_argument("--no-sweep", action="store_true", help="skip the sweep comparison (faster)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from experiments import branch_report
    from experiments.runner import Progress
    from harness import ServerProcess

    names = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in names if t not in BRANCH_TASKS]
    if unknown:
        print(f"unknown task(s) {unknown}; choose from {sorted(BRANCH_TASKS)}", file=sys.stderr)
        return 2
    out: Path = args.out / "full"
    progress = Progress()
    database = (out / "noisescope.db").resolve()
    database.parent.mkdir(parents=True, exist_ok=True)
    server = ServerProcess(f"sqlite:///{database}", log_path=out / "server.log").start()
    progress.line(f"noisescope server on {server.url}")
    try:
        results = []
        for name in names:
            results.append(
                run_task(
                    TASKS[BRANCH_TASKS[name].task],
                    BRANCH_TASKS[name],
                    out,
                    server.url,
                    progress,
                    not args.no_sweep,
                )
            )
        command = "python -m experiments.branching " + shlex.join(
            sys.argv[1:] if argv is None else argv
        )
        body = branch_report.render(results, args.docs, command.strip())
        path = args.docs / "reproduction.md"
        sections.write(path, SECTION, body)
        progress.line(f"wrote the {SECTION!r} section of {path}")
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
