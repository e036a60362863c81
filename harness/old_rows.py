"""Rows written straight into a database at an older revision, through the tables as that
revision has them (reflected): the write path (``crud``) follows the newest schema, so it
cannot populate an older one. Used by the migration tests to check that upgrading keeps
every row as it was."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

#: A token secret stored at an old revision (its sha256 is what the row holds).
OLD_SECRET = "nsk_stored-before-scopes"


def _filler(table: sa.Table, i: int, **given: Any) -> dict[str, Any]:
    """A row of ``table``: ``given``, then a value for every other column without a server
    default, nullable ones too (strings empty, numbers ``i + 1``: a block's sums and counts
    then agree), except an autoincrementing key."""
    row = dict(given)
    for column in table.columns:
        if column.name in row or column.server_default is not None:
            continue
        if (
            column.primary_key
            and column.autoincrement in (True, "auto")
            and len(table.primary_key.columns) == 1
        ):
            continue
        python = column.type.python_type if not isinstance(column.type, sa.JSON) else dict
        row[column.name] = "" if python is str else {} if python is dict else i + 1
    return row


def populate(engine: sa.Engine, project: str = "p") -> dict[str, int]:
    """One project with a task, a run with 3 samples, 1 sample block and 1 event, and a token
    (secret ``OLD_SECRET``), plus a deleted run where the table exists; rows per table."""
    import hashlib

    meta = sa.MetaData()
    meta.reflect(engine)
    t = meta.tables
    now = datetime.now(UTC)
    with engine.begin() as conn:
        rid = _insert_run(conn, t, "keep-me", project, now)
        pid = conn.execute(sa.select(t["run"].c.project_id).where(t["run"].c.id == rid))
        pid = pid.scalar_one()
        for seq in range(3):
            conn.execute(
                t["sample"].insert().values(_filler(t["sample"], seq, run_id=rid, seq=seq))
            )
        block = _filler(t["sample_block"], 0, run_id=rid, series="", block=0)
        conn.execute(t["sample_block"].insert().values(block))
        event = {"run_id": rid, "seq": 0, "step": 1, "kind": "mark", "payload": {"x": 1}}
        conn.execute(t["event"].insert().values(event))
        secret_hash = hashlib.sha256(OLD_SECRET.encode()).hexdigest()
        token = {"project_id": pid, "name": "old", "token_hash": secret_hash, "created_at": now}
        conn.execute(t["token"].insert().values(token))
        if "deleted_run" in t:
            gone = {"uid": "gone-run", "project_id": pid, "deleted_at": now}
            conn.execute(t["deleted_run"].insert().values(gone))
        return {
            name: int(conn.execute(sa.select(sa.func.count()).select_from(t[name])).scalar_one())
            for name in t
            if name != "alembic_version"
        }


def _insert_run(
    conn: sa.Connection, t: Any, uid: str, project: str, now: datetime, task: str = "t"
) -> int:
    """A finished run ``uid`` of a new project and task, as the tables have them; its id."""
    pid = conn.execute(
        t["project"].insert().values(name=project, created_at=now).returning(t["project"].c.id)
    ).scalar_one()
    tid = conn.execute(
        t["task"].insert().values(project_id=pid, name=task).returning(t["task"].c.id)
    ).scalar_one()
    run = {"uid": uid, "project_id": pid, "task_id": tid, "name": "kept", "started_at": now}
    run |= {"config": {"lr": 0.1}, "tags": ["a"], "status": "finished", "units": "examples"}
    return int(
        conn.execute(
            t["run"].insert().values(**run, batch_size=32.0).returning(t["run"].c.id)
        ).scalar_one()
    )


def old_run(engine: sa.Engine, uid: str, project: str = "p") -> int:
    """A run ``uid`` (batch 32, project ``project``, task ``t``) written through the tables as
    the database's revision has them; its id."""
    meta = sa.MetaData()
    meta.reflect(engine)
    with engine.begin() as conn:
        return _insert_run(conn, meta.tables, uid, project, datetime.now(UTC))


def dump(engine: sa.Engine, tables: list[str] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Every row of ``tables`` (default: all but Alembic's), as dicts, in a stable order."""
    meta = sa.MetaData()
    meta.reflect(engine)
    names = tables or [n for n in meta.tables if n != "alembic_version"]
    out = {}
    with engine.connect() as conn:
        for name in names:
            rows = [dict(r._mapping) for r in conn.execute(sa.select(meta.tables[name]))]
            out[name] = sorted(rows, key=repr)
    return out


#: A revision no noisescope of this version knows: what a newer one would have written.
FUTURE_REVISION = "0999"


def future_database(url: str) -> None:
    """The database at ``url`` upgraded, populated, then stamped ``FUTURE_REVISION``: as a
    newer noisescope would leave it."""
    from noisescope_server import db

    engine = db.make_engine(url)
    db.upgrade(engine)
    populate(engine)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = :v"), {"v": FUTURE_REVISION})
    engine.dispose()


def database_state(url: str) -> object:
    """What a refused command must not change, comparable with ``==``: the SQLite file's
    sha256, or every row (Alembic's too) on another backend."""
    import hashlib

    from noisescope_server import db

    path = db.sqlite_path(url)
    if path is not None:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    engine = sa.create_engine(url)
    try:
        return dump(engine, None) | dump(engine, ["alembic_version"])
    finally:
        engine.dispose()
