"""What a task's batch-size sweep reads: its runs, their evaluations and batch-size changes, and
their noise samples as bucket sums along steps (``noisescope_server.sweeps`` assembles them
into ``noisescope.sweep``'s runs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, func, select

from noisescope import protocol
from noisescope_server.errors import Forbidden, NotFound
from noisescope_server.models import Event, Project, Run, Task
from noisescope_server.queries._buckets import BucketSums, bucket_sums
from noisescope_server.queries._common import archived_filter, finite_number, run_status


@dataclass(frozen=True)
class TaskSweep:
    """The stored facts of one task's sweep, read in one connection (and one bucket query)."""

    #: Its branch runs (``noisescope.branch``), which are no points of the sweep.
    n_branches: int
    #: Its other unarchived runs, oldest first: ``id``, ``uid``, ``name``, ``batch_size``,
    #: ``units``, ``status`` (``run_status``) and ``config`` of each.
    runs: list[Any]
    #: Each run's evaluation losses (step, loss) in step order, by run id.
    evals: dict[int, list[tuple[float, float]]]
    #: The runs whose batch size changed (a ``batch_size`` event, a scheduler's).
    changed: set[int]
    #: Each run's bucket sums along steps, by run uid.
    buckets: dict[str, list[BucketSums]]


def read_task_sweep(
    engine: Engine,
    project: str,
    task: str,
    *,
    max_points: int,
    project_scope: int | None = None,
    crash_after: float = protocol.CRASH_AFTER,
) -> TaskSweep:
    """The runs of ``project/task`` a sweep is made of, with at most ``max_points`` buckets
    each. Raises ``NotFound`` for an unknown task and ``Forbidden`` outside
    ``project_scope``."""
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
    changed: set[int] = set()
    for run_id, kind, step, payload in events:
        if kind == protocol.BATCH_SIZE_EVENT_KIND:
            changed.add(int(run_id))
            continue
        value = finite_number(payload.get("loss")) if isinstance(payload, dict) else None
        if value is not None:
            evals.setdefault(int(run_id), []).append((float(step), value))
    buckets: dict[str, list[BucketSums]] = {}
    for b in bucket_sums(engine, [str(r.uid) for r in runs], max_points=max_points):
        buckets.setdefault(b.run_uid, []).append(b)
    return TaskSweep(
        n_branches=int(n_branches),
        runs=list(runs),
        evals=evals,
        changed=changed,
        buckets=buckets,
    )
