"""Deleted run ids: the server remembers each (``deleted_run``) and answers writes to one
with 410 Gone, so a job still running when its run was deleted, or its spool synced later,
cannot bring the run back partial; reusing the id is an explicit act (``reuse_deleted``)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, delete, select

from noisescope import protocol
from noisescope_server.crud._sql import insert_ignore
from noisescope_server.errors import Gone
from noisescope_server.models import DeletedRun
from noisescope_server.utc import as_utc

#: How to reuse a deleted id on purpose, for every 410's message and docs/api.md.
REUSE_HOW = (
    "to reuse this id on purpose, PUT {path}?reuse_deleted=true with a token that has the "
    "'manage' scope; otherwise start a new run (a new id)"
)


def remember_deleted(conn: Connection, run_uid: str, project_id: int, now: datetime) -> None:
    """Mark ``run_uid`` deleted (in the delete's transaction; a second mark keeps the first)."""
    values = {"uid": run_uid, "project_id": project_id, "deleted_at": now}
    insert_ignore(conn, DeletedRun, values, ["uid"])


def deleted_at(conn: Connection, run_uid: str) -> datetime | None:
    """When ``run_uid`` was deleted, None if it never was (or was reused since)."""
    when = conn.execute(select(DeletedRun.deleted_at).where(DeletedRun.uid == run_uid)).scalar()
    return None if when is None else as_utc(when)


def gone(run_uid: str, when: datetime) -> Gone:
    """The 410 for a write to a deleted run: when, why it stays deleted, and what to do."""
    path = protocol.runs_path(run_uid)
    return Gone(
        f"run {run_uid!r} was deleted at {when.isoformat(timespec='seconds')} and stays "
        "deleted: the server refuses writes to it so that a job or a sync cannot bring it "
        "back partial; " + REUSE_HOW.format(path=path)
    )


def refuse_if_deleted(conn: Connection, run_uid: str) -> None:
    """Gone when ``run_uid`` was deleted."""
    when = deleted_at(conn, run_uid)
    if when is not None:
        raise gone(run_uid, when)


def forget_deleted(conn: Connection, run_uid: str, project_id: int) -> bool:
    """Reuse ``run_uid`` in its own project: forget that it was deleted there; whether it
    had been (an id deleted in another project stays refused)."""
    stmt = delete(DeletedRun).where(DeletedRun.uid == run_uid, DeletedRun.project_id == project_id)
    return bool(conn.execute(stmt, execution_options={"preserve_rowcount": True}).rowcount)
