"""Measure the local critical batch size by branching a running job (Merrill et al. 2025).

From the parent run's current state, short continuations ("branches") train at batch sizes
b, 2b, 4b, ... on the same number of examples (tokens when ``units="tokens"``), the learning
rate rescaled by a rule; the local critical batch size is the largest batch whose loss after
that budget stays within a relative tolerance ε of the smallest batch's
(``estimators.local_critical_batch``; docs/science.md, "Measuring the critical batch size
directly (branching)"). The user supplies what only they know, as a :class:`Branchable`::

    plan = noisescope.branch.plan(step=1000, batch_size=32, lr=0.1, budget=4096)
    result = noisescope.branch.run(plan, trainer, store="branches/step1000")
    result.local.b_crit, result.local.b_crit_lo, result.local.b_crit_hi

Every branch's loss is written to ``store`` as soon as it finishes, so a killed sweep resumes
without redoing finished branches; a job scheduler can run the branches in parallel instead
(``run_one`` per branch key, then ``collect``). The parent's state is saved once and restored
before every branch and after the last, so the parent run continues exactly where it was.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from noisescope import _wire
from noisescope.estimators import (
    LocalCriticalBatch,
    check_positive,
    epsilon_problem,
    local_critical_batch,
    scaled_lr,
)

__all__ = [
    "LR_RULES",
    "Branch",
    "BranchPlan",
    "BranchResult",
    "BranchStore",
    "BranchSweep",
    "Branchable",
    "Every",
    "Hooks",
    "LogTo",
    "collect",
    "plan",
    "run",
    "run_one",
]

#: How a branch's learning rate follows its batch size (``estimators.scaled_lr``).
LR_RULES = ("linear", "sqrt", "constant")
#: Steps the largest branch takes when no budget is given.
DEFAULT_STEPS_AT_LARGEST = 8


@dataclass(frozen=True)
class Branch:
    """One continuation: ``steps`` optimizer steps at ``batch_size`` and ``lr``, data ``seed``."""

    key: str
    step: int
    batch_size: int
    multiplier: int
    lr: float
    examples: int
    steps: int
    seed: int


@dataclass(frozen=True)
class BranchPlan:
    """Every branch of one branch point: multipliers x seeds, one example budget each."""

    step: int
    base_batch_size: int
    base_lr: float
    multipliers: tuple[int, ...]
    budget: int
    lr_rule: str
    seeds: tuple[int, ...]
    epsilon: float
    level: float = 0.9
    units: str = "examples"
    parent_run_id: str | None = None

    @property
    def branches(self) -> list[Branch]:
        out = []
        for m in self.multipliers:
            b = self.base_batch_size * m
            lr = scaled_lr(self.base_lr, b, self.base_batch_size, self.lr_rule)
            for seed in self.seeds:
                key = f"step{self.step}-b{b}-seed{seed}"
                out.append(Branch(key, self.step, b, m, lr, self.budget, self.budget // b, seed))
        return out

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> BranchPlan:
        d = json.loads(text)
        d["multipliers"] = tuple(d["multipliers"])
        d["seeds"] = tuple(d["seeds"])
        return cls(**d)


def plan(
    step: int,
    batch_size: int,
    lr: float,
    *,
    multipliers: Sequence[int] = (1, 2, 4, 8),
    budget: int | None = None,
    lr_rule: str = "linear",
    seeds: int | Sequence[int] = 3,
    epsilon: float = 0.01,
    level: float = 0.9,
    units: str = "examples",
    parent_run_id: str | None = None,
) -> BranchPlan:
    """Plan a branch point at ``step`` of a run training at ``batch_size`` with ``lr``.

    ``budget``: examples (tokens) every branch trains on; it must be a multiple of every
    branch's batch size (default: ``DEFAULT_STEPS_AT_LARGEST`` steps of the largest batch).
    ``seeds``: how many (or which) data seeds each batch size runs with; 2 or more give the
    interval. ``epsilon``: the relative loss tolerance.
    """
    if lr_rule not in LR_RULES:
        raise ValueError(f"lr_rule must be one of {LR_RULES}, got {lr_rule!r}")
    if not (isinstance(batch_size, int) and batch_size > 0):
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    check_positive("lr", lr)
    mults = tuple(sorted({int(m) for m in multipliers}))
    if len(mults) < 2 or mults[0] < 1 or len(mults) != len(tuple(multipliers)):
        raise ValueError(f"multipliers must be 2 or more distinct integers >= 1, got {multipliers}")
    largest = batch_size * mults[-1]
    budget = largest * DEFAULT_STEPS_AT_LARGEST if budget is None else int(budget)
    uneven = [batch_size * m for m in mults if budget % (batch_size * m)]
    if budget <= 0 or uneven:
        raise ValueError(
            f"budget {budget} must be a positive multiple of every branch's batch size "
            f"(not of {uneven}); e.g. {largest * DEFAULT_STEPS_AT_LARGEST}"
        )
    seed_list = tuple(range(seeds)) if isinstance(seeds, int) else tuple(int(s) for s in seeds)
    if not seed_list or len(set(seed_list)) != len(seed_list):
        raise ValueError(f"seeds must be a count >= 1 or distinct seeds, got {seeds!r}")
    problem = epsilon_problem(epsilon)
    if problem is not None:
        raise ValueError(problem)
    return BranchPlan(
        int(step),
        batch_size,
        float(lr),
        mults,
        budget,
        lr_rule,
        seed_list,
        float(epsilon),
        float(level),
        units,
        parent_run_id,
    )


class Branchable(Protocol):
    """What the user's training code provides; noisescope calls it in this order per branch:
    ``restore(state)``, ``train(branch, run)``, ``evaluate()``."""

    def save(self) -> Any:
        """The full training state (parameters, optimizer, schedulers, RNGs): a copy."""
        ...

    def restore(self, state: Any) -> None:
        """Put back a state returned by ``save`` (it must not be changed by later training)."""
        ...

    def train(self, branch: Branch, run: Any | None) -> None:
        """Train ``branch.steps`` steps at ``branch.batch_size``, ``branch.lr``, data seed
        ``branch.seed``; ``run`` (a ``noisescope.Run`` or None) takes the branch's samples."""
        ...

    def evaluate(self) -> float:
        """The evaluation loss of the current state (the same data for every branch)."""
        ...


@dataclass(frozen=True)
class Hooks:
    """A :class:`Branchable` from four callables."""

    save_fn: Callable[[], Any]
    restore_fn: Callable[[Any], None]
    train_fn: Callable[[Branch, Any | None], None]
    evaluate_fn: Callable[[], float]

    def save(self) -> Any:
        return self.save_fn()

    def restore(self, state: Any) -> None:
        self.restore_fn(state)

    def train(self, branch: Branch, run: Any | None) -> None:
        self.train_fn(branch, run)

    def evaluate(self) -> float:
        return float(self.evaluate_fn())


@dataclass(frozen=True)
class BranchResult:
    key: str
    batch_size: int
    seed: int
    loss: float
    run_id: str | None = None


class BranchStore:
    """One JSON file per finished branch under ``directory`` (written atomically), plus the
    plan and the parent's loss; safe for parallel jobs that each write their own branches."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def _write(self, name: str, payload: Mapping[str, Any]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f)
        os.replace(tmp, self.directory / name)

    def save_plan(self, branch_plan: BranchPlan) -> None:
        existing = self.load_plan()
        if existing is not None and existing != branch_plan:
            raise ValueError(
                f"{self.directory} holds a different plan ({existing}); use another directory "
                "for a new branch point or plan"
            )
        self._write("plan.json", json.loads(branch_plan.to_json()))

    def load_plan(self) -> BranchPlan | None:
        path = self.directory / "plan.json"
        return BranchPlan.from_json(path.read_text()) if path.exists() else None

    def save_parent_loss(self, loss: float) -> None:
        self._write("parent.json", {"loss": loss})

    def parent_loss(self) -> float | None:
        path = self.directory / "parent.json"
        return float(json.loads(path.read_text())["loss"]) if path.exists() else None

    def save_result(self, result: BranchResult) -> None:
        self._write(f"branch-{result.key}.json", asdict(result))

    def results(self) -> dict[str, BranchResult]:
        out = {}
        for path in sorted(self.directory.glob("branch-*.json")):
            r = BranchResult(**json.loads(path.read_text()))
            out[r.key] = r
        return out


@dataclass(frozen=True)
class BranchSweep:
    """A branch point's outcome: the plan, each branch's loss, the local critical batch size
    (None while branches are missing), the parent's loss at the branch point."""

    plan: BranchPlan
    results: tuple[BranchResult, ...]
    missing: tuple[str, ...]
    parent_loss: float | None
    local: LocalCriticalBatch | None = None
    reused: int = 0
    notes: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class LogTo:
    """Log every branch as its own run (linked to the parent) through ``noisescope.init``."""

    project: str
    task: str
    url: str | None = None
    name: str | None = None
    init_kwargs: Mapping[str, Any] = field(default_factory=dict)


def _open_run(branch_plan: BranchPlan, branch: Branch, log: LogTo | None) -> Any | None:
    if log is None:
        return None
    from noisescope._run import init

    prefix = log.name or (branch_plan.parent_run_id or "run")[:12]
    run_id = None
    if branch_plan.parent_run_id is not None:
        # The same branch of the same parent is the same run: a resumed or repeated sweep
        # re-sends it instead of leaving an orphan beside it.
        digest = hashlib.sha256(f"{branch_plan.parent_run_id}/{branch.key}".encode()).hexdigest()
        run_id = f"branch-{digest[:32]}"
    return init(
        log.url,
        project=log.project,
        task=log.task,
        name=f"{prefix} branch@{branch.step} b={branch.batch_size} seed={branch.seed}",
        batch_size=branch.batch_size,
        units=branch_plan.units,
        config={
            "branch": {
                "parent_run_id": branch_plan.parent_run_id,
                "step": branch.step,
                "multiplier": branch.multiplier,
                "lr": branch.lr,
                "lr_rule": branch_plan.lr_rule,
                "budget": branch_plan.budget,
                "seed": branch.seed,
                "epsilon": branch_plan.epsilon,
            }
        },
        run_id=run_id,
        parent_run_id=branch_plan.parent_run_id,
        branch_step=branch.step if branch_plan.parent_run_id is not None else None,
        **dict(log.init_kwargs),
    )


def run_one(
    branch_plan: BranchPlan,
    key: str,
    trainer: Branchable,
    store: BranchStore | str | os.PathLike[str],
    *,
    state: Any = None,
    log: LogTo | None = None,
) -> BranchResult:
    """Train and evaluate the one branch ``key`` (a scheduler's job) from ``state`` (default:
    the trainer's current state), store its loss, and put ``state`` back."""
    store = store if isinstance(store, BranchStore) else BranchStore(store)
    done = store.results()
    if key in done:
        return done[key]
    branches = {b.key: b for b in branch_plan.branches}
    if key not in branches:
        raise KeyError(f"no branch {key!r} in the plan; keys: {sorted(branches)}")
    store.save_plan(branch_plan)
    parent_state = trainer.save() if state is None else state
    branch = branches[key]
    trainer.restore(parent_state)
    branch_run = _open_run(branch_plan, branch, log)
    status = "failed"
    try:
        trainer.train(branch, branch_run)
        loss = float(trainer.evaluate())
        if branch_run is not None:
            diverged = not math.isfinite(loss)
            branch_run.log_event(
                branch.steps,
                _wire.BRANCH_EVENT_KIND,
                {"loss": None if diverged else loss, "diverged": diverged},
            )
            if not diverged:
                branch_run.log(step=branch.steps, eval_loss=loss, examples=branch.examples)
        status = "finished"
    finally:
        if branch_run is not None:
            branch_run.finish(status)
        trainer.restore(parent_state)
    result = BranchResult(
        key, branch.batch_size, branch.seed, loss, getattr(branch_run, "id", None)
    )
    store.save_result(result)
    return result


def collect(branch_plan: BranchPlan, store: BranchStore | str | os.PathLike[str]) -> BranchSweep:
    """Read the finished branches of ``branch_plan`` from ``store``; the local critical batch
    size once every branch is in (``missing`` lists the others)."""
    store = store if isinstance(store, BranchStore) else BranchStore(store)
    done = store.results()
    keys = [b.key for b in branch_plan.branches]
    results = tuple(done[k] for k in keys if k in done)
    missing = tuple(k for k in keys if k not in done)
    local = None
    if not missing:
        by_batch: dict[int, list[float]] = {}
        for r in results:
            by_batch.setdefault(r.batch_size, []).append(r.loss)
        sizes = sorted(by_batch)
        local = local_critical_batch(
            sizes,
            [by_batch[b] for b in sizes],
            epsilon=branch_plan.epsilon,
            level=branch_plan.level,
        )
    return BranchSweep(branch_plan, results, missing, store.parent_loss(), local)


def run(
    branch_plan: BranchPlan,
    trainer: Branchable,
    store: BranchStore | str | os.PathLike[str],
    *,
    log: LogTo | None = None,
) -> BranchSweep:
    """Run every branch of ``branch_plan`` in sequence (skipping those already in ``store``),
    then put the parent's state back and return the measurement."""
    store = store if isinstance(store, BranchStore) else BranchStore(store)
    store.save_plan(branch_plan)
    parent_state = trainer.save()
    notes: list[str] = []
    parent_loss = store.parent_loss()
    if parent_loss is None:
        parent_loss = float(trainer.evaluate())
        store.save_parent_loss(parent_loss)
    done = store.results()
    try:
        for branch in branch_plan.branches:
            if branch.key not in done:
                run_one(branch_plan, branch.key, trainer, store, state=parent_state, log=log)
    finally:
        trainer.restore(parent_state)
    after = float(trainer.evaluate())
    if not math.isclose(after, parent_loss, rel_tol=1e-6, abs_tol=1e-12):
        # restore() that does not restore would bias every branch after the first; a resumed
        # sweep from another state would mix two branch points.
        msg = (
            f"the parent's evaluation loss is {after!r} after the branches but {parent_loss!r} "
            "at the branch point"
            + (
                " (stored by the first attempt: is the trainer at the branch point's state?)"
                if done
                else ""
            )
            + ": check that save() copies and restore() restores the full state"
        )
        warnings.warn(msg, stacklevel=2)
        notes.append(msg)
    keys = {b.key for b in branch_plan.branches}
    sweep = collect(branch_plan, store)
    reused = len(keys & set(done))
    return BranchSweep(
        sweep.plan, sweep.results, sweep.missing, parent_loss, sweep.local, reused, tuple(notes)
    )


class Every:
    """Branch every ``every`` steps: call it from a training loop or a framework callback's
    step hook (opt-in). Each branch point gets its own store under ``store``; ``plan_kwargs``
    go to :func:`plan` (multipliers, budget, lr_rule, seeds, epsilon, units, parent_run_id).
    """

    def __init__(
        self,
        every: int,
        trainer: Branchable,
        store: str | os.PathLike[str],
        *,
        log: LogTo | None = None,
        first: int | None = None,
        **plan_kwargs: Any,
    ) -> None:
        if not (isinstance(every, int) and every >= 1):
            raise ValueError(f"every must be an integer >= 1, got {every!r}")
        self.every = every
        self.first = every if first is None else int(first)
        self.trainer = trainer
        self.store = Path(store)
        self.log = log
        self.plan_kwargs = plan_kwargs
        self.sweeps: list[BranchSweep] = []

    def due(self, step: int) -> bool:
        """Whether ``step`` is a branch step (``first``, ``first + every``, ...)."""
        return step >= self.first and (step - self.first) % self.every == 0

    def __call__(self, step: int, *, batch_size: int, lr: float) -> BranchSweep | None:
        """At a branch step: branch from the current state (batch ``batch_size``, ``lr``)."""
        if not self.due(step):
            return None
        branch_plan = plan(step, batch_size, lr, **self.plan_kwargs)
        result = run(branch_plan, self.trainer, self.store / f"step{step}", log=self.log)
        self.sweeps.append(result)
        return result
