"""What every read shares: the intervals' level, a run's row and status as readers see it,
the project scope check, plain-tuple fetches and finite numbers from JSON."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any, Literal

import orjson
from sqlalchemy import Connection, and_, case, func, select, true

from noisescope import protocol
from noisescope.protocol import finite_number as finite_number
from noisescope_server.errors import BadInput, Forbidden, NotFound
from noisescope_server.models import Project, Run, Task
from noisescope_server.utc import utcnow

#: Confidence level of every interval the query layer returns.
LEVEL = 0.9


def run_status(crash_after: float = protocol.CRASH_AFTER) -> Any:
    """A run's status as readers see it: a stored "running" whose process has not been heard
    from (any write or heartbeat sets ``last_seen_at``) for ``crash_after`` seconds reads
    "crashed". Computed at read time, so a run that sends again reads "running" again and
    workers hold no state."""
    cutoff = utcnow() - timedelta(seconds=crash_after)
    seen = func.coalesce(Run.last_seen_at, Run.started_at)
    return case((and_(Run.status == "running", seen < cutoff), "crashed"), else_=Run.status)


def run_select(crash_after: float = protocol.CRASH_AFTER) -> Any:
    """The run columns a summary reads, with the status as ``run_status`` reads it."""
    return (
        select(
            Run.id,
            Run.uid,
            Project.name.label("project"),
            Task.name.label("task"),
            Run.name,
            Run.tags,
            Run.config,
            Run.batch_size,
            Run.units,
            run_status(crash_after).label("status"),
            Run.started_at,
            Run.ended_at,
            Run.last_seen_at,
            Run.project_id,
            Run.parent_uid,
            Run.branch_step,
            Run.archived_at,
        )
        .join(Project, Project.id == Run.project_id)
        .join(Task, Task.id == Run.task_id)
    )


def scoped_run(
    conn: Connection,
    run_uid: str,
    project_scope: int | None,
    crash_after: float = protocol.CRASH_AFTER,
) -> Any:
    """One run's row; ``NotFound`` for an unknown uid, ``Forbidden`` outside the scope."""
    row = conn.execute(run_select(crash_after).where(Run.uid == run_uid)).first()
    if row is None:
        raise NotFound(f"run {run_uid!r} does not exist")
    if project_scope is not None and int(row.project_id) != project_scope:
        raise Forbidden(f"this token does not grant access to the project of run {run_uid!r}")
    return row


def json_value(raw: Any) -> Any:
    """A JSON column's value from a plain DBAPI row (``fetch_tuples``): SQLite hands back its
    text, psycopg the parsed value. orjson first (a long run's 50,000 evaluations parse in a
    fraction of the time), ``json`` where orjson refuses (a number beyond a double, which
    ``json`` reads as the SQLAlchemy column would); None for text that is no JSON."""
    if not isinstance(raw, (str, bytes)):
        return raw
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        try:
            return json.loads(raw)
        except ValueError:
            return None


def fetch_tuples(
    conn: Connection, stmt: Any, parameters: dict[str, Any] | None = None
) -> list[Any]:
    """A statement's rows (with its bound ``parameters``) as plain DBAPI tuples (no per-row
    result objects)."""
    cursor = conn.execute(stmt, parameters).cursor
    assert cursor is not None
    return list(cursor.fetchall())


#: Which runs a read lists: not archived ones (the default), all, or archived ones only.
Archived = Literal["exclude", "include", "only"]
ARCHIVED_CHOICES: tuple[str, ...] = ("exclude", "include", "only")


def archived_filter(archived: str = "exclude") -> Any:
    """The WHERE clause of ``archived`` (``Archived``) on the run table; ``BadInput`` for a
    value that is none of them."""
    if archived == "exclude":
        return Run.archived_at.is_(None)
    if archived == "only":
        return Run.archived_at.is_not(None)
    if archived == "include":
        return true()
    raise BadInput(f"archived must be one of {', '.join(ARCHIVED_CHOICES)}, got {archived!r:.40}")


#: Evaluations a run needs for its evaluation curve to count (the sweep's and the run
#: summary's divergence read the same curve).
MIN_EVALS = 2
