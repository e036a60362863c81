"""A task's batch-size sweep read from the database and handed to ``noisescope.sweep``.

The analysis itself (crossings, the frontier of the fastest learning rate per batch size, the
S-E fit and its interval, B_simple at the same loss, default targets) lives once, in
``noisescope.sweep``. This module decides only what each run contributes:

- its batch size: the one given at ``init`` (else the largest B_big it logged); a run whose
  batch size changed (a ``batch_size`` event, the scheduler's) is left out, since the model
  assumes one batch size per run;
- its learning rate, which groups runs into seeds: ``config["lr"]`` or
  ``config["learning_rate"]``, else the peak of the logged learning rate;
- its loss curve: the evaluation losses it logged (``eval`` events), or its training loss
  bucketed along steps, for all runs alike (``loss``: ``auto`` takes evaluations when every
  run has at least two);
- its noise samples, as exact bucket sums along steps;
- whether it diverged: ``noisescope.sweep`` judges that on the same curve and leaves such runs
  out (``include_diverged`` keeps them).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any, Literal

from sqlalchemy import Engine, func, select

from noisescope import protocol, sweep
from noisescope.estimators import training_loss_curve
from noisescope_server.errors import BadInput, Forbidden, NotFound
from noisescope_server.models import Event, Project, Run, Task
from noisescope_server.queries import LEVEL, BucketSums, bucket_sums, finite_number, run_status
from noisescope_server.queries._common import MIN_EVALS, archived_filter

__all__ = ["LOSS_CHOICES", "MAX_POINTS_PER_RUN", "critical_batch"]

LossChoice = Literal["auto", "eval", "train"]
LOSS_CHOICES: tuple[LossChoice, ...] = ("auto", "eval", "train")
#: Buckets per run along steps: runs up to this many steps keep one point per step.
MAX_POINTS_PER_RUN = 1000


def _learning_rate(config: dict[str, Any], buckets: Sequence[BucketSums]) -> float | None:
    for key in ("lr", "learning_rate"):
        value = finite_number(config.get(key))
        if value is not None and value > 0:
            return value
    logged = [b.lr for b in buckets if b.lr is not None and math.isfinite(b.lr)]
    return max(logged) if logged else None


def _train_curve(buckets: Sequence[BucketSums]) -> tuple[list[float], list[float]]:
    """Each bucket's mean loss weighted by the samples that carried one, as the run list's
    divergence check reads it (``queries._runs._diverged``)."""
    kept = [b for b in buckets if b.loss is not None]
    return training_loss_curve(
        [(b.step_lo + b.step) / 2.0 for b in kept],
        [float(b.loss) for b in kept if b.loss is not None],
        [float(b.n_loss) for b in kept],
    )


def critical_batch(
    engine: Engine,
    project: str,
    task: str,
    *,
    targets: Sequence[float] | None = None,
    loss: LossChoice = "auto",
    project_scope: int | None = None,
    crash_after: float = protocol.CRASH_AFTER,
    include_diverged: bool = False,
) -> sweep.CriticalBatchReport:
    """The critical batch size of ``project/task`` per loss target (``noisescope.sweep``).

    Runs whose loss diverged (``sweep.divergence`` on the curve the targets are crossed on)
    are left out, under ``excluded``, unless ``include_diverged``. Raises ``NotFound`` for an
    unknown task and ``Forbidden`` outside ``project_scope``.
    """
    if loss not in LOSS_CHOICES:
        raise BadInput(f"loss must be one of {', '.join(LOSS_CHOICES)}, got {loss!r}")
    with engine.connect() as conn:
        found = conn.execute(
            select(Task.id, Project.id)
            .join(Project, Project.id == Task.project_id)
            .where(Project.name == project, Task.name == task)
        ).first()
        if found is None:
            raise NotFound(f"task {project!r:.100}/{task!r:.100} does not exist")
        task_id, project_id = int(found[0]), int(found[1])
        if project_scope is not None and project_id != project_scope:
            raise Forbidden(f"this token does not grant access to project {project!r:.100}")
        # Branch runs (noisescope.branch) continue another run from its checkpoint: they do not
        # start at initialisation, so they are no points of the sweep.
        n_branches = conn.execute(
            select(func.count())
            .select_from(Run)
            .where(Run.task_id == task_id, Run.parent_uid.is_not(None), archived_filter())
        ).scalar_one()
        runs = conn.execute(
            select(
                Run.id,
                Run.uid,
                Run.name,
                Run.batch_size,
                Run.units,
                run_status(crash_after).label("status"),
                Run.config,
            )
            # archived runs are no points of the sweep: archiving is how a run is taken out
            .where(Run.task_id == task_id, Run.parent_uid.is_(None), archived_filter())
            .order_by(Run.started_at, Run.id)
        ).all()
        run_ids = [int(r.id) for r in runs]
        events = conn.execute(
            select(Event.run_id, Event.kind, Event.step, Event.payload)
            .where(
                Event.run_id.in_(run_ids),
                Event.kind.in_([protocol.EVAL_EVENT_KIND, protocol.BATCH_SIZE_EVENT_KIND]),
            )
            .order_by(Event.run_id, Event.step, Event.id)
        ).all()
    evals: dict[int, list[tuple[float, float]]] = {}
    changed: set[int] = set()  # runs whose batch size changed (a scheduler's events)
    for run_id, kind, step, payload in events:
        if kind == protocol.BATCH_SIZE_EVENT_KIND:
            changed.add(int(run_id))
            continue
        value = finite_number(payload.get("loss")) if isinstance(payload, dict) else None
        if value is not None:
            evals.setdefault(int(run_id), []).append((float(step), value))
    buckets: dict[str, list[BucketSums]] = {}
    for b in bucket_sums(engine, [str(r.uid) for r in runs], max_points=MAX_POINTS_PER_RUN):
        buckets.setdefault(b.run_uid, []).append(b)

    units = Counter(str(r.units) for r in runs).most_common(1)[0][0] if runs else "examples"
    excluded: list[sweep.ExcludedRun] = []
    candidates = []
    for r in runs:
        mine = buckets.get(str(r.uid), [])
        batch = finite_number(r.batch_size)
        if batch is None or batch <= 0:
            logged = [b.batch_size for b in mine if b.batch_size is not None]
            batch = max(logged) if logged else None
        out: tuple[sweep.ExclusionKind, str] | None = None
        if str(r.units) != units:
            out = "units", f"counts {r.units}, the task's other runs count {units}"
        elif batch is None:
            out = "no_batch_size", "no batch size: pass batch_size= to noisescope.init"
        elif int(r.id) in changed:
            out = (
                "batch_size_changed",
                "its batch size changed during the run; a sweep needs one batch size per run",
            )
        if out is not None:
            excluded.append(sweep.ExcludedRun(str(r.uid), str(r.name), *out))
            continue
        candidates.append((r, float(batch), mine))  # type: ignore[arg-type]

    with_evals = [r for r, _, _ in candidates if len(evals.get(int(r.id), [])) >= MIN_EVALS]
    source: sweep.LossSource
    notes: list[str] = []
    if n_branches:
        notes.append(
            f"{n_branches} branch runs of this task are left out: they continue another run "
            "from a checkpoint (see GET /runs/{id}/branches)"
        )
    if loss == "eval" or (loss == "auto" and candidates and len(with_evals) == len(candidates)):
        source = "eval"
    else:
        source = "train"
        if loss == "auto" and with_evals:
            notes.append(
                f"{len(with_evals)} of {len(candidates)} runs logged evaluation losses; a fit "
                "must compare one kind of loss, so every run is read by its training loss "
                "(log eval_loss in every run to use evaluations)"
            )
    sweep_runs = []
    for r, batch, mine in candidates:
        if source == "eval":
            points = evals.get(int(r.id), [])
            if len(points) < MIN_EVALS:
                excluded.append(
                    sweep.ExcludedRun(
                        str(r.uid),
                        str(r.name),
                        "too_few_evaluations",
                        f"fewer than {MIN_EVALS} evaluation losses",
                    )
                )
                continue
            steps, losses = [p[0] for p in points], [p[1] for p in points]
        else:
            steps, losses = _train_curve(mine)
            if not steps:
                excluded.append(
                    sweep.ExcludedRun(str(r.uid), str(r.name), "no_loss", "logged no loss")
                )
                continue
        sweep_runs.append(
            sweep.SweepRun(
                uid=str(r.uid),
                name=str(r.name),
                batch_size=batch,
                lr=_learning_rate(dict(r.config or {}), mine),
                steps=steps,
                losses=losses,
                noise=[
                    sweep.NoiseBucket(b.step_lo, b.step, b.n, b.sum_g_sq, b.sum_trace_sigma)
                    for b in mine
                ],
                status=str(r.status),
            )
        )
    return sweep.analyse(
        sweep_runs,
        targets,
        project=project,
        task=task,
        units=units,
        loss_source=source,
        excluded=excluded,
        warnings=notes,
        level=LEVEL,
        keep_diverged=include_diverged,
    )
