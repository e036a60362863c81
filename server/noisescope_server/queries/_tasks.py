"""Projects and the per-task summary across runs."""

from __future__ import annotations

import statistics

from sqlalchemy import Engine, select

from noisescope import protocol
from noisescope.protocol import RunSummary, TaskSummary
from noisescope_server.models import Project
from noisescope_server.queries._runs import list_runs


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
    """One row per (project, task), for cross-task comparison; archived runs count in none."""
    runs = list_runs(
        engine,
        project=project,
        limit=1_000_000,
        project_scope=project_scope,
        crash_after=crash_after,
    )
    groups: dict[tuple[str, str], list[RunSummary]] = {}
    for r in runs:
        groups.setdefault((r.project, r.task), []).append(r)
    out = []
    for (proj, task), members in sorted(groups.items()):
        b_values = [r.b_simple for r in members if r.b_simple is not None]
        starts = [r.started_at for r in members if r.started_at is not None]
        out.append(
            TaskSummary(
                project=proj,
                task=task,
                n_runs=len(members),
                n_running=sum(r.status == "running" for r in members),
                n_samples=sum(r.n_samples for r in members),
                batch_sizes=sorted({r.batch_size for r in members if r.batch_size is not None}),
                units=sorted({r.units for r in members}),
                last_started_at=max(starts) if starts else None,
                n_measured=len(b_values),
                b_simple_median=statistics.median(b_values) if b_values else None,
                b_simple_min=min(b_values) if b_values else None,
                b_simple_max=max(b_values) if b_values else None,
            )
        )
    return out
