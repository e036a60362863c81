"""Rows written straight into a database at an older revision, through the tables as that
revision has them (reflected): the write path (``crud``) follows the newest schema, so it
cannot populate an older one. Used by the migration tests to check that upgrading keeps
every row as it was."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from noisescope_server.validate import SampleBatch

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

    from noisescope.estimators import two_batch_estimates

    meta = sa.MetaData()
    meta.reflect(engine)
    t = meta.tables
    now = datetime.now(UTC)
    with engine.begin() as conn:
        rid = _insert_run(conn, t, "keep-me", project, now)
        pid = conn.execute(sa.select(t["run"].c.project_id).where(t["run"].c.id == rid))
        pid = pid.scalar_one()
        # from 0007 on a series is its number in the run's series table (the whole model's 0)
        series = {"series_id": 0} if "series" in t else {"series": ""}
        if "series" in t:
            conn.execute(t["series"].insert().values(run_id=rid, id=0, name=""))
        for seq in range(3):
            # a sample ingest could have stored: 0 < b_small < b_big, and before 0007 its
            # estimates as ingest computed them (from 0007 on, readers derive them)
            sizes = {"b_small": 8.0, "b_big": 32.0, "g_small_sq": seq + 2.0, "g_big_sq": seq + 1.0}
            if "g_sq_est" in t["sample"].c:
                sizes["g_sq_est"], sizes["trace_sigma_est"] = two_batch_estimates(
                    sizes["b_small"], sizes["b_big"], sizes["g_small_sq"], sizes["g_big_sq"]
                )
            row = _filler(t["sample"], seq, run_id=rid, seq=seq, **series, **sizes)
            conn.execute(t["sample"].insert().values(row))
        block = _filler(t["sample_block"], 0, run_id=rid, block=0, **series)
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


def old_samples(engine: sa.Engine, uid: str, batch: SampleBatch) -> None:
    """A validated batch's samples stored in run ``uid`` as revisions before 0007 stored
    them (each row with its series' name and its estimates), then the run's blocks summed
    again from its rows as those revisions' SQL did (``protocol.BLOCK_AGGREGATES``)."""
    from noisescope import protocol

    meta = sa.MetaData()
    meta.reflect(engine)
    sample = meta.tables["sample"]
    stored = {**batch.columns, "g_sq_est": batch.g_sq_est, "trace_sigma_est": batch.trace_sigma_est}
    aggregates = ", ".join(f"{how}({name})" for _, how, name in protocol.BLOCK_AGGREGATES)
    blocks = ", ".join(column for column, _, _ in protocol.BLOCK_AGGREGATES)
    with engine.begin() as conn:
        run_id = conn.execute(sa.text("SELECT id FROM run WHERE uid = :u"), {"u": uid}).scalar_one()
        rows = [
            {"run_id": run_id, **{name: stored[name][i] for name in protocol.READ_COLUMNS}}
            for i in range(batch.n)
        ]
        conn.execute(sample.insert(), rows)
        conn.execute(sa.text("DELETE FROM sample_block WHERE run_id = :r"), {"r": run_id})
        conn.execute(
            sa.text(
                f"INSERT INTO sample_block (run_id, series, block, {blocks}) "
                f"SELECT run_id, series, seq / 64, {aggregates} FROM sample WHERE run_id = :r "
                "GROUP BY run_id, series, seq / 64"
            ),
            {"r": run_id},
        )


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
