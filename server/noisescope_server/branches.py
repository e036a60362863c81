"""A run's branch points assembled from its branch runs (``noisescope.branch``), which
``queries.read_run_branches`` reads.

Each branch run carries ``parent_uid`` and ``branch_step`` (its columns), its batch size, its
plan in ``config["branch"]`` (seed, ε) and its outcome as a ``branch`` event (the loss after the
budget, or diverged). Per branch step the local critical batch size is recomputed with
``estimators.local_critical_batch``, the same function the client's ``branch.run`` used, so the
server and the training job give the same number from the same losses.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import replace
from typing import Any

from sqlalchemy import Engine

from noisescope.estimators import branch_mean_loss, epsilon_problem, local_critical_batch
from noisescope.forecast import plateau
from noisescope.protocol import BranchPointResult, RunBranches
from noisescope_server.queries import finite_number, read_run_branches

__all__ = ["LEVEL", "run_branches"]

LEVEL = 0.9
#: ε when a branch run's config does not say (``noisescope.branch.plan``'s default).
DEFAULT_EPSILON = 0.01


def _branch_config(config: Any) -> dict[str, Any]:
    branch = config.get("branch") if isinstance(config, dict) else None
    return branch if isinstance(branch, dict) else {}


def _epsilon(config: Any) -> float | None:
    """A branch run's ε: its config's, ``DEFAULT_EPSILON`` when the config names none, None
    when the stored value breaks the estimators' rule (rows written before the write path
    checked it, ``validate.branch_plan_problem``): such a run is left out with a note, the
    read never fails on it."""
    raw = _branch_config(config).get("epsilon")
    if raw is None:
        return DEFAULT_EPSILON
    return float(raw) if epsilon_problem(raw) is None else None


def _point(
    step: int, parent_loss: float | None, kids: list[Any], outcomes: dict[int, dict[str, Any]]
) -> BranchPointResult:
    every_kid = kids
    bad = [k for k in kids if _epsilon(k.config) is None]
    bad_note = None
    if bad:
        shown = sorted({repr(_branch_config(k.config).get("epsilon")) for k in bad})
        bad_note = (
            f"{len(bad)} of {len(kids)} branch runs have an ε that is no positive number "
            f"({', '.join(shown)}) and are left out"
        )
        kids = [k for k in kids if _epsilon(k.config) is not None]
    epsilons = Counter(_epsilon(k.config) or DEFAULT_EPSILON for k in kids)
    epsilon = epsilons.most_common(1)[0][0] if epsilons else DEFAULT_EPSILON
    by_batch: dict[float, list[tuple[float, float]]] = defaultdict(list)  # (seed, loss)
    pending = 0
    for k in kids:
        outcome = outcomes.get(int(k.id))
        size = finite_number(k.batch_size)
        if outcome is None or size is None or size <= 0:
            pending += 1
            continue
        loss = finite_number(outcome.get("loss"))
        if loss is None and outcome.get("diverged") is not True:
            pending += 1
            continue
        seed = finite_number(_branch_config(k.config).get("seed")) or 0.0
        by_batch[size].append((seed, math.inf if loss is None else loss))
    sizes = sorted(by_batch)
    losses = [[v for _, v in sorted(by_batch[b])] for b in sizes]
    means = [branch_mean_loss(row) for row in losses]
    base = BranchPointResult(
        step=step,
        parent_loss=parent_loss,
        epsilon=epsilon,
        level=LEVEL,
        batch_sizes=sizes,
        mean_loss=[m if math.isfinite(m) else None for m in means],
        seeds=min((len(r) for r in losses), default=0),
        n_runs=len(every_kid),
        run_ids=sorted(str(k.uid) for k in every_kid),
        b_crit=None,
        b_crit_lo=None,
        b_crit_hi=None,
        reason=None,
    )
    mixed = bad_note
    if len(epsilons) > 1:
        mixed = "; ".join(
            r
            for r in (
                bad_note,
                f"branch runs of this step disagree on ε ({sorted(epsilons)}); used {epsilon:g}",
            )
            if r
        )

    def noted(msg: str) -> BranchPointResult:
        return replace(base, reason="; ".join(r for r in (mixed, msg) if r))

    if not kids:
        return replace(base, reason=bad_note)
    if pending:
        msg = f"{pending} of {len(kids)} branch runs have no outcome yet (running or crashed)"
        return noted(msg)
    if len(sizes) < 2:
        return noted("fewer than 2 batch sizes have an outcome")
    if any(not math.isfinite(v) for v in losses[0]):
        return noted("the smallest batch's branches diverged: no reference loss")
    local = local_critical_batch(sizes, losses, epsilon=epsilon, level=LEVEL)
    return replace(
        base,
        b_crit=local.b_crit,
        b_crit_lo=local.b_crit_lo,
        b_crit_hi=local.b_crit_hi,
        b_crit_interpolated=local.b_crit_interpolated,
        reason="; ".join(r for r in (mixed, local.reason) if r) or None,
    )


def run_branches(engine: Engine, run_uid: str, *, project_scope: int | None = None) -> RunBranches:
    """Every branch step of ``run_uid`` with its local critical batch size, oldest first."""
    read = read_run_branches(engine, run_uid, project_scope=project_scope)  # NotFound / Forbidden
    parent, parent_losses = read.parent, read.parent_losses
    by_step: dict[int, list[Any]] = defaultdict(list)
    other_units: Counter[int] = Counter()
    for k in read.kids:
        if str(k.units) == str(parent.units):
            by_step[int(k.branch_step or 0)].append(k)
        else:  # batch sizes in other units than the parent's are never compared
            other_units[int(k.branch_step or 0)] += 1
    points = []
    for step in sorted(by_step):
        before = [loss for s, loss in parent_losses if s <= step]
        point = _point(step, before[-1] if before else None, by_step[step], read.outcomes)
        point = replace(point, parent_examples=read.parent_examples.get(step))
        if other_units[step]:
            left_out = (
                f"{other_units[step]} branch runs count other units than the parent "
                f"({parent.units}) and are left out"
            )
            point = replace(point, reason="; ".join(r for r in (point.reason, left_out) if r))
        points.append(point)
    # numbers and brackets (both ends known) take part; a lower bound alone does not
    measured = [p for p in points if p.b_crit is not None or p.b_crit_hi is not None]
    flat = plateau(
        [p.step for p in measured],
        [p.b_crit for p in measured],
        [p.b_crit_lo for p in measured],
        [p.b_crit_hi for p in measured],
    )
    return RunBranches(
        run_uid=str(parent.uid),
        units=str(parent.units),
        points=points,
        plateau_step=flat.step,
        plateau_b_crit=flat.b_crit,
        plateau_reason=flat.reason,
    )
