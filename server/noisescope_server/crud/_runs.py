"""Projects, tasks and runs: get-or-create, the run upsert and patch, and the run-row lock."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, delete, func, select, update

from noisescope import protocol
from noisescope_server.crud._deleted import (
    deleted_at,
    forget_deleted,
    refuse_if_deleted,
    remember_deleted,
)
from noisescope_server.crud._sql import LOCK_RUN, TOUCH_RUN, insert_ignore
from noisescope_server.db import write_transaction
from noisescope_server.errors import BadInput, Conflict, Forbidden, NotFound
from noisescope_server.models import (
    Event,
    Project,
    Run,
    RunDigest,
    Sample,
    SampleBlock,
    SampleChunk,
    Series,
    Task,
)
from noisescope_server.utc import as_utc, utcnow
from noisescope_server.validate import check_run_uid


def get_or_create_project(conn: Connection, name: str) -> int:
    insert_ignore(conn, Project, {"name": name, "created_at": utcnow()}, ["name"])
    return int(conn.execute(select(Project.id).where(Project.name == name)).scalar_one())


def get_or_create_task(conn: Connection, project_id: int, name: str) -> int:
    insert_ignore(conn, Task, {"project_id": project_id, "name": name}, ["project_id", "name"])
    return int(
        conn.execute(
            select(Task.id).where(Task.project_id == project_id, Task.name == name)
        ).scalar_one()
    )


@dataclass(frozen=True)
class RunIn:
    """A validated PUT /runs/{uid} body (see ``api.schemas.RunPut``)."""

    project: str
    task: str
    name: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)
    batch_size: float | None = None
    units: str = "examples"
    status: str = "running"
    started_at: datetime | None = None
    #: A branch run: its parent's uid and the parent step it started at (both or neither).
    parent_uid: str | None = None
    branch_step: int | None = None


@dataclass(frozen=True)
class RunRef:
    id: int
    uid: str
    project_id: int
    project: str
    #: What the write stored otherwise than sent, and why (a time from the future), for the
    #: answer's ``warnings``.
    notes: tuple[str, ...] = ()


#: How far ahead of the server's clock a run's ``started_at``/``ended_at`` may be and still be
#: stored as sent: clocks kept by NTP differ by far less. A time further ahead comes from a
#: skewed clock (a client a day ahead would list its run as the newest for a day), and is
#: stored as the server's time, with a warning in the answer.
FUTURE_TOLERANCE = timedelta(minutes=5)


def _span(delta: timedelta) -> str:
    """A clock difference as people say it ("1.0 days", "3.2 hours", "7 min")."""
    seconds = delta.total_seconds()
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:,.1f} days"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.1f} hours"
    return f"{seconds / 60:.0f} min"


def not_ahead(name: str, value: datetime, now: datetime) -> tuple[datetime, str | None]:
    """``value`` (a client's time), or ``now`` with a note saying why when it lies more than
    ``FUTURE_TOLERANCE`` ahead of the server's clock."""
    value = as_utc(value)
    if value - now <= FUTURE_TOLERANCE:
        return value, None
    sent, server = value.isoformat(timespec="seconds"), now.isoformat(timespec="seconds")
    return now, (
        f"{name} {sent} is {_span(value - now)} ahead of the server's clock ({server}): stored "
        "as the server's time; check the clock of the machine that sent it"
    )


def lock_run(conn: Connection, run_uid: str) -> RunRef | None:
    """Find a run and, on PostgreSQL, lock its row for this transaction.

    Concurrent ingests into the same run then serialise (needed for exact ``sample_block``
    sums); different runs never wait for each other. Every write transaction locks at most one
    run row, so there is no lock-order cycle and no deadlock. SQLite already serialises writers
    through ``BEGIN IMMEDIATE``.
    """
    row = conn.execute(LOCK_RUN[conn.dialect.name], {"run_uid": run_uid}).first()
    return None if row is None else RunRef(int(row[0]), str(row[1]), int(row[2]), str(row[3]))


def require_run(conn: Connection, run_uid: str, project_scope: int | None) -> RunRef:
    """``lock_run``, or Gone (a deleted run) / NotFound (unknown run) / Forbidden (run
    outside ``project_scope``)."""
    run = lock_run(conn, check_run_uid(run_uid))
    if run is None:
        refuse_if_deleted(conn, run_uid)
        path = protocol.runs_path(run_uid)
        raise NotFound(f"run {run_uid!r} does not exist: create it first with PUT {path}")
    if project_scope is not None and run.project_id != project_scope:
        raise Forbidden(f"this token does not grant access to the project of run {run_uid!r}")
    return run


#: The 409 for a run id another project holds: it names neither that project nor its runs.
_TAKEN = (
    "run id {run_uid!r} is already taken by another project; a run cannot move between "
    "projects: use a new run id (the client generates a fresh uuid4 hex when none is given)"
)


def _check_parent(conn: Connection, run_uid: str, parent_uid: str, project_id: int) -> None:
    """BadInput for a parent link the branch reader could never show: a run's branches are
    read in its own project, one level deep. A parent not stored (yet) is fine: branch runs
    may arrive first (runs are created in the background, and sync sends spools in any
    order), and their points show once it is there."""
    parent = conn.execute(
        select(Run.project_id, Run.parent_uid).where(Run.uid == parent_uid)
    ).first()
    if parent is not None and int(parent.project_id) != project_id:
        raise BadInput(
            f"parent_run_id {parent_uid!r} is a run of another project: a branch run belongs "
            "to its parent's project"
        )
    if parent is not None and parent.parent_uid is not None:
        raise BadInput(
            f"parent_run_id {parent_uid!r} is itself a branch (of {parent.parent_uid!r}): "
            "branch from the run it branched from (branches are one level deep)"
        )
    kids = select(Run.id).where(Run.parent_uid == run_uid, Run.project_id == project_id)
    if conn.execute(kids.limit(1)).first() is not None:
        raise BadInput(
            f"run {run_uid!r} has branch runs of its own, so it cannot become a branch "
            f"(parent_run_id {parent_uid!r}): branches are one level deep"
        )


def upsert_run(
    engine: Engine,
    run_uid: str,
    run: RunIn,
    *,
    project_scope: int | None = None,
    reuse_deleted: bool = False,
) -> tuple[RunRef, bool]:
    """Create or update a run by its client-generated uid; returns (run, created).

    Idempotent: a retried PUT updates the same row. A run never moves to another project.
    ``started_at`` keeps its first value (a resumed client may re-send a later one), and a
    name or tags set on the server (PATCH) stay (``keep_edited``). A deleted run's id is Gone
    unless ``reuse_deleted``, which creates the run afresh under it.
    """
    check_run_uid(run_uid)
    if run.parent_uid is not None and check_run_uid(run.parent_uid) == run_uid:
        raise BadInput(f"run {run_uid!r} cannot be a branch of itself (parent_run_id)")
    with write_transaction(engine) as conn:
        project_id = get_or_create_project(conn, run.project)
        if project_scope is not None and project_id != project_scope:
            raise Forbidden(f"this token does not grant access to project {run.project!r}")
        task_id = get_or_create_task(conn, project_id, run.task)
        existing = lock_run(conn, run_uid)
        if existing is None and not (reuse_deleted and forget_deleted(conn, run_uid, project_id)):
            refuse_if_deleted(conn, run_uid)
        if run.parent_uid is not None:
            _check_parent(conn, run_uid, run.parent_uid, project_id)
        values: dict[str, Any] = {
            "task_id": task_id,
            "name": run.name,
            "config": run.config,
            "tags": run.tags,
            "batch_size": run.batch_size,
            "units": run.units,
            "status": run.status,
            "last_seen_at": utcnow(),
        }
        if run.parent_uid is not None:  # a re-PUT without them never un-branches a run
            values |= {"parent_uid": run.parent_uid, "branch_step": run.branch_step}
        if existing is None:
            now = utcnow()
            started, note = not_ahead("started_at", run.started_at or now, now)
            values |= {"uid": run_uid, "project_id": project_id, "started_at": started}
            created = insert_ignore(conn, Run, values, ["uid"]) == 1
            ref = lock_run(conn, run_uid)
            assert ref is not None
            if ref.project_id != project_id:  # lost a creation race to another project's PUT
                raise Conflict(_TAKEN.format(run_uid=run_uid))
            if not created:  # lost a creation race to a concurrent PUT of the same run
                conn.execute(update(Run).where(Run.id == ref.id).values(**values))
            return (replace(ref, notes=(note,)) if note and created else ref), created
        if existing.project_id != project_id:
            raise Conflict(_TAKEN.format(run_uid=run_uid))
        notes = keep_edited(conn, existing.id, values)
        conn.execute(update(Run).where(Run.id == existing.id).values(**values))
        return replace(existing, notes=notes), False


#: The run fields a person may change on the server (PATCH) that a PUT also carries.
EDITABLE = ("name", "tags")


def keep_edited(conn: Connection, run_id: int, values: dict[str, Any]) -> tuple[str, ...]:
    """Drop from a PUT's ``values`` the fields changed on the server (``Run.edited``): the
    change made by hand wins over a job's (re-)sent or replayed run body. A note for each
    kept field that the PUT would have changed, for the answer's ``warnings``."""
    row = conn.execute(select(Run.name, Run.tags, Run.edited).where(Run.id == run_id)).one()
    stored = {"name": row.name, "tags": row.tags}
    notes = []
    for field_name in row.edited or ():
        sent = values.pop(field_name, None)
        if field_name in stored and sent != stored[field_name]:
            notes.append(
                f"{field_name} kept as {stored[field_name]!r}, set on the server (PATCH); "
                f"this PUT's {sent!r} was not applied (a change made on the server wins over "
                "a job's run body; PATCH the run to change it again)"
            )
    return tuple(notes)


def patch_run(
    engine: Engine,
    run_uid: str,
    *,
    status: str | None = None,
    ended_at: datetime | None = None,
    batch_size: float | None = None,
    name: str | None = None,
    tags: list[str] | None = None,
    archived: bool | None = None,
    project_scope: int | None = None,
) -> RunRef:
    """Update a run's status (finished runs get ``ended_at`` = now unless given; one ahead
    of the server's clock is stored as now, with a note: ``not_ahead``), its name, its tags
    (the whole list) or whether it is archived. None leaves a field as it is.

    Archiving keeps a run's first ``archived_at`` (archiving twice is no change) and does not
    count as hearing from the run: a patch of only these leaves ``last_seen_at`` alone, so an
    archived crashed run still reads crashed."""
    with write_transaction(engine) as conn:
        run = require_run(conn, run_uid, project_scope)
        now = utcnow()
        by_hand = name is not None or tags is not None or archived is not None
        from_job = status is not None or ended_at is not None or batch_size is not None
        values: dict[str, Any] = {} if by_hand and not from_job else {"last_seen_at": now}
        if name is not None:
            values["name"] = name
        if tags is not None:
            values["tags"] = list(tags)
        if name is not None or tags is not None:
            values["edited"] = _edited(conn, run.id, name=name, tags=tags)
        if archived is not None:
            # archived_at keeps its first time: COALESCE in SQL, so a second archive is no change
            values["archived_at"] = func.coalesce(Run.archived_at, now) if archived else None
        if status is not None:
            values["status"] = status
            if status != "running" and ended_at is None:
                ended_at = now
        note = None
        if ended_at is not None:
            values["ended_at"], note = not_ahead("ended_at", ended_at, now)
        if batch_size is not None:
            values["batch_size"] = batch_size
        if values:
            conn.execute(update(Run).where(Run.id == run.id).values(**values))
        return replace(run, notes=(note,)) if note else run


def _edited(conn: Connection, run_id: int, **changed: object) -> list[str]:
    """``Run.edited`` after a PATCH that sets the fields of ``changed`` not None."""
    before = conn.execute(select(Run.edited).where(Run.id == run_id)).scalar() or []
    now = {name for name, value in changed.items() if value is not None}
    return [name for name in EDITABLE if name in now or name in before]


def delete_run(engine: Engine, run_uid: str, *, project_scope: int | None = None) -> RunRef:
    """Delete a run for good: its samples (rows and chunks), sample blocks, series names,
    events and its row,
    in one transaction, and nothing else (its project, task and any branch runs stay; a branch run
    whose parent is gone reads as a run with an unknown parent, as before its parent came).

    The rows are deleted explicitly, not left to ``ON DELETE CASCADE``: SQLite enforces foreign
    keys only with ``PRAGMA foreign_keys``, which a database opened elsewhere may lack.

    The id is remembered (``_deleted``): later writes to it answer 410 Gone."""
    with write_transaction(engine) as conn:
        if lock_run(conn, check_run_uid(run_uid)) is None:  # require_run's says "create it"
            when = deleted_at(conn, run_uid)
            if when is not None:
                raise NotFound(
                    f"run {run_uid!r} does not exist: it was deleted at "
                    f"{when.isoformat(timespec='seconds')}"
                )
            raise NotFound(f"run {run_uid!r} does not exist (deleted already, or a typo?)")
        run = require_run(conn, run_uid, project_scope)
        remember_deleted(conn, run.uid, run.project_id, utcnow())
        conn.execute(delete(Sample).where(Sample.run_id == run.id))
        conn.execute(delete(SampleBlock).where(SampleBlock.run_id == run.id))
        conn.execute(delete(SampleChunk).where(SampleChunk.run_id == run.id))
        conn.execute(delete(Series).where(Series.run_id == run.id))
        conn.execute(delete(RunDigest).where(RunDigest.run_id == run.id))
        conn.execute(delete(Event).where(Event.run_id == run.id))
        conn.execute(delete(Run).where(Run.id == run.id))
        return run


def touch_run(engine: Engine, run_uid: str, *, project_scope: int | None = None) -> RunRef:
    """A heartbeat: the run's process is alive (sets ``last_seen_at``; nothing else changes)."""
    with write_transaction(engine) as conn:
        run = require_run(conn, run_uid, project_scope)
        conn.execute(TOUCH_RUN, {"run_id": run.id, "now": utcnow()})
        return run
