"""Projects and the per-task summary across runs."""

from __future__ import annotations

import statistics
from typing import Any

from sqlalchemy import Engine, select

from noisescope import protocol
from noisescope.protocol import TaskSummary
from noisescope_server.models import Project, Run, Task
from noisescope_server.queries._common import archived_filter, run_status
from noisescope_server.queries._runs import current_b_simple
from noisescope_server.utc import as_utc


def list_projects(engine: Engine, *, project_scope: int | None = None) -> list[str]:
    """Project names in order (only the scoped one under ``project_scope``)."""
    stmt = select(Project.name).order_by(Project.name)
    if project_scope is not None:
        stmt = stmt.where(Project.id == project_scope)
    with engine.connect() as conn:
        return [str(r[0]) for r in conn.execute(stmt)]


def task_summaries(
    engine: Engine,
    project: str | None = None,
    *,
    project_scope: int | None = None,
    crash_after: float = protocol.CRASH_AFTER,
) -> list[TaskSummary]:
    """One row per (project, task), for cross-task comparison; archived runs count in none.

    The runs' fields in one query and their current B_simple from ``current_b_simple`` (a
    compacted run's stored digest, a live run's window): the same values as ``list_runs``,
    without the rest of a run summary, so thousands of runs answer in one pass."""
    stmt = (
        select(
            Run.id,
            Project.name,
            Task.name,
            run_status(crash_after),
            Run.batch_size,
            Run.units,
            Run.started_at,
        )
        .join(Project, Project.id == Run.project_id)
        .join(Task, Task.id == Run.task_id)
        .where(archived_filter("exclude"))
    )
    if project is not None:
        stmt = stmt.where(Project.name == project)
    if project_scope is not None:
        stmt = stmt.where(Run.project_id == project_scope)
    with engine.connect() as conn:
        rows = conn.execute(stmt).all()
        measured = current_b_simple(conn, [int(r[0]) for r in rows])
    groups: dict[tuple[str, str], list[Any]] = {}
    for r in rows:
        groups.setdefault((str(r[1]), str(r[2])), []).append(r)
    out = []
    for (proj, task), members in sorted(groups.items()):
        found = [measured[int(r[0])] for r in members]
        b_values = [b for _, b in found if b is not None]
        starts = [as_utc(r[6]) for r in members if r[6] is not None]
        out.append(
            TaskSummary(
                project=proj,
                task=task,
                n_runs=len(members),
                n_running=sum(r[3] == "running" for r in members),
                n_samples=sum(n for n, _ in found),
                batch_sizes=sorted({r[4] for r in members if r[4] is not None}),
                units=sorted({str(r[5]) for r in members}),
                last_started_at=max(starts) if starts else None,
                n_measured=len(b_values),
                b_simple_median=statistics.median(b_values) if b_values else None,
                b_simple_min=min(b_values) if b_values else None,
                b_simple_max=max(b_values) if b_values else None,
            )
        )
    return out
