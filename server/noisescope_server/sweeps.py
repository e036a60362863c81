"""A task's batch-size sweep, read by ``queries`` and handed to ``noisescope.sweep``.

The reading (the task's runs, their evaluations, batch-size changes and bucket sums) is
``queries.read_task_sweep``; the analysis itself (crossings, the frontier of the fastest
learning rate per batch size, the S-E fit and its interval, B_simple at the same loss, default
targets) lives once, in ``noisescope.sweep``. This module decides only what each run
contributes:

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
  out (``include_diverged`` keeps them);
- the default loss targets: those the runs declare in their config
  (``sweep.declared_targets``), else ``sweep.default_targets``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any, Literal

from sqlalchemy import Engine

from noisescope import protocol, sweep
from noisescope.estimators import training_loss_curve
from noisescope_server.errors import BadInput
from noisescope_server.queries import (
    LEVEL,
    MIN_EVALS,
    BucketSums,
    TaskSweep,
    finite_number,
    read_task_sweep,
)

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


#: A run that may be a point of the sweep: its row, its batch size and its buckets.
_Candidate = tuple[Any, float, list[BucketSums]]


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
    read = read_task_sweep(
        engine,
        project,
        task,
        max_points=MAX_POINTS_PER_RUN,
        project_scope=project_scope,
        crash_after=crash_after,
    )
    runs = read.runs
    units = Counter(str(r.units) for r in runs).most_common(1)[0][0] if runs else "examples"
    candidates, excluded = _candidates(read, units)
    source, notes = _loss_source(read, candidates, loss)
    sweep_runs = _sweep_runs(read, candidates, source, excluded)  # adds to ``excluded``
    # none asked for: the targets the runs declare (``python -m experiments`` writes them), the
    # one rule of default targets the dashboard and the experiment's output follow too
    declared = sweep.declared_targets(r.config for r in runs if isinstance(r.config, dict))
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
        declared=declared,
    )


def _candidates(read: TaskSweep, units: str) -> tuple[list[_Candidate], list[sweep.ExcludedRun]]:
    """The runs that may be points (one batch size each, in the task's units) and those left
    out, with why."""
    excluded: list[sweep.ExcludedRun] = []
    candidates: list[_Candidate] = []
    for r in read.runs:
        mine = read.buckets.get(str(r.uid), [])
        batch = finite_number(r.batch_size)
        if batch is None or batch <= 0:
            logged = [b.batch_size for b in mine if b.batch_size is not None]
            batch = max(logged) if logged else None
        out: tuple[sweep.ExclusionKind, str] | None = None
        if str(r.units) != units:
            out = "units", f"counts {r.units}, the task's other runs count {units}"
        elif batch is None:
            out = "no_batch_size", "no batch size: pass batch_size= to noisescope.init"
        elif int(r.id) in read.changed:
            out = (
                "batch_size_changed",
                "its batch size changed during the run; a sweep needs one batch size per run",
            )
        if out is not None:
            excluded.append(sweep.ExcludedRun(str(r.uid), str(r.name), *out))
            continue
        candidates.append((r, float(batch), mine))  # type: ignore[arg-type]
    return candidates, excluded


def _loss_source(
    read: TaskSweep, candidates: list[_Candidate], loss: LossChoice
) -> tuple[sweep.LossSource, list[str]]:
    """Which loss every run is read by (one kind for all), and the notes that explain it."""
    with_evals = [r for r, _, _ in candidates if len(read.evals.get(int(r.id), [])) >= MIN_EVALS]
    source: sweep.LossSource
    notes: list[str] = []
    if read.n_branches:
        notes.append(
            f"{read.n_branches} branch runs of this task are left out: they continue another run "
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
    return source, notes


def _sweep_runs(
    read: TaskSweep,
    candidates: list[_Candidate],
    source: sweep.LossSource,
    excluded: list[sweep.ExcludedRun],
) -> list[sweep.SweepRun]:
    """The candidates with a loss curve of ``source``, as ``noisescope.sweep`` takes them;
    those without one are added to ``excluded``."""
    sweep_runs = []
    for r, batch, mine in candidates:
        if source == "eval":
            points = read.evals.get(int(r.id), [])
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
    return sweep_runs
