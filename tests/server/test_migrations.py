"""Alembic: empty -> head -> base -> head, models == migrated schema, data kept on upgrade.

Runs on SQLite and PostgreSQL (``db_url``).
"""

from __future__ import annotations

from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect, text

from harness import columns
from harness.old_rows import dump, old_run, populate
from noisescope_server import crud, db, queries
from noisescope_server.crud import _samples
from noisescope_server.models import Base

TABLES = {
    "project", "task", "run", "sample", "sample_block", "sample_chunk", "run_digest", "event",
    "token", "deleted_run",
}  # fmt: skip
#: The tables ``_populate`` fills (a run is compacted, filling the others, only when asked;
#: deleted_run exists from 0005 on).
FILLED = TABLES - {"sample_chunk", "run_digest", "deleted_run"}


def _tables(engine: Engine) -> set[str]:
    return set(inspect(engine).get_table_names()) - {"alembic_version"}


def _diffs(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        return list(compare_metadata(ctx, Base.metadata))


def test_upgrade_downgrade_upgrade(db_url: str) -> None:
    engine = db.make_engine(db_url)
    assert db.upgrade(engine) == (None, db.head_revision())
    assert _tables(engine) == TABLES
    assert db.upgrade(engine) == (db.head_revision(), db.head_revision())  # idempotent
    db.downgrade(engine, "base")
    assert _tables(engine) == set()
    assert db.current_revision(engine) is None
    db.upgrade(engine)
    assert _tables(engine) == TABLES
    engine.dispose()


def test_models_match_migrated_schema(db_url: str) -> None:
    engine = db.make_engine(db_url)
    db.upgrade(engine)
    assert _diffs(engine) == []
    engine.dispose()


def test_single_head_and_every_step_reversible(db_url: str) -> None:
    script = ScriptDirectory.from_config(db._alembic_config())
    assert len(script.get_heads()) == 1
    engine = db.make_engine(db_url)
    revisions = [r.revision for r in reversed(list(script.walk_revisions()))]
    for rev in revisions:  # up one step at a time, then down one, then up again
        db.upgrade(engine, rev)
        db.downgrade(engine, "-1")
        db.upgrade(engine, rev)
        assert db.current_revision(engine) == rev
    engine.dispose()


def _ingest(engine: Engine, uid: str, batch: crud.SampleBatch) -> None:
    """``crud.ingest_samples``, or, below revision 0006 (no ``sample_chunk`` for ingest to look
    for chunks to reopen in), its rows and blocks written as that revision's ingest wrote them."""
    if "sample_chunk" in _tables(engine):
        crud.ingest_samples(engine, uid, batch)
        return
    with db.write_transaction(engine) as conn:
        run_id = conn.execute(text("SELECT id FROM run WHERE uid = :uid"), {"uid": uid})
        run_id = run_id.scalar_one()
        _samples.insert_samples(conn, run_id, batch)
        _samples.refresh_blocks(conn, run_id, batch.columns["seq"])


def _populate(engine: Engine) -> dict[str, int]:
    """Rows in every table of the database's revision (written through the tables as that
    revision has them: ``crud`` follows the newest schema), counted per table of ``FILLED``."""
    counts = populate(engine)
    return {t: counts.get(t, 0) for t in FILLED}


def test_rows_survive_upgrading_from_every_previous_revision(db_url: str) -> None:
    """Populate at each earlier revision, upgrade to head, count rows: the tables a revision
    had keep every row (a table added later starts empty).

    At head this checks that re-running the upgrade on a populated head keeps every row; each
    new migration extends it automatically.
    """
    script = ScriptDirectory.from_config(db._alembic_config())
    revisions = [r.revision for r in reversed(list(script.walk_revisions()))]
    for rev in revisions:
        engine = db.make_engine(db_url)
        db.downgrade(engine, "base") if db.current_revision(engine) else None
        db.upgrade(engine, rev)
        counts = _populate(engine)
        assert all(counts[t] > 0 for t in FILLED)
        db.upgrade(engine)
        with engine.connect() as conn:
            after = {
                t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one() for t in FILLED
            }
        assert after == counts
        engine.dispose()


def test_concurrent_upgrades_do_not_race(db_url: str) -> None:
    """Several workers starting at once: all upgrades succeed and the schema is created once."""
    import threading

    errors: list[BaseException] = []
    engines = [db.make_engine(db_url) for _ in range(4)]
    barrier = threading.Barrier(len(engines))

    def start(engine: Engine) -> None:
        try:
            barrier.wait()
            db.upgrade(engine)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert db.current_revision(engines[0]) == db.head_revision()
    for e in engines:
        e.dispose()


def test_runs_stored_before_archiving_read_as_not_archived(db_url: str) -> None:
    """0004 adds ``run.archived_at``: a run stored at 0003 is listed (not archived) after it."""
    from noisescope_server import queries

    engine = db.make_engine(db_url)
    db.upgrade(engine, "0003")
    populate(engine)
    db.upgrade(engine)
    (run,) = queries.list_runs(engine, current=False)
    assert (run.uid, run.archived_at) == ("keep-me", None)
    assert queries.list_runs(engine, archived="only") == []
    engine.dispose()


def test_upgrading_a_populated_0004_database_keeps_every_row_and_scopes_its_tokens(
    db_url: str,
) -> None:
    """0005 adds token scopes, remembered deleted runs and ``run.edited``: every row stored at
    0004 reads the same after it (the new columns aside), every existing token holds ``read
    write`` (a job and a dashboard keep working; deleting needs a new ``manage`` token), no
    run reads as edited and no id as deleted."""
    engine = db.make_engine(db_url)
    db.upgrade(engine, "0004")
    populate(engine)
    before = dump(engine)
    db.upgrade(engine, "0005")
    after = dump(engine)
    assert after["deleted_run"] == []
    assert [t["scopes"] for t in after["token"]] == ["read write"]
    assert [r["edited"] for r in after["run"]] == [None]
    for table, rows in before.items():
        new_columns = {"scopes", "edited"}
        kept = [{k: v for k, v in r.items() if k not in new_columns} for r in after[table]]
        assert kept == rows, table
    db.downgrade(engine, "0004")  # and back: the rows of 0004 as they were
    assert dump(engine) == before
    engine.dispose()


def test_a_run_stored_at_0004_compacts_to_the_same_csv(db_url: str) -> None:
    """Rows written before chunks existed: upgraded, compacted and read back, every sample is
    the same, the CSV byte for byte."""
    engine = db.make_engine(db_url)
    db.upgrade(engine, "0004")
    old_run(engine, "old")  # crud follows the newest schema: the run as 0004 stored it
    for k, name in enumerate(("", "layer.transformer.h.3.mlp.c_fc.weight")):
        cols = columns(500, seed=k, series=name)
        cols["seq"] = [2 * s + k for s in cols["seq"]]
        cols["loss"] = [None if i % 3 == 0 else v for i, v in enumerate(cols["loss"])]
        _ingest(engine, "old", crud.validate_samples({"columns": cols}))
    before_0006 = _csv_of_rows(engine)  # as the code of 0004 writes it, from the rows
    blocks = _blocks(engine)
    db.upgrade(engine)
    assert "".join(queries.raw_samples_csv(engine, "old")) == before_0006
    with engine.connect() as conn:
        run_id = conn.execute(text("SELECT id FROM run WHERE uid = 'old'")).scalar_one()
    assert crud.compact_run(engine, run_id).samples == 1000
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM sample")).scalar_one() == 0
    assert "".join(queries.raw_samples_csv(engine, "old")) == before_0006
    db.downgrade(engine, "0004")  # back to rows, with the estimates as ingest stored them
    assert _csv_of_rows(engine) == before_0006
    assert _blocks(engine) == pytest.approx(blocks, rel=1e-12, nan_ok=True)  # by seq again
    engine.dispose()


def _blocks(engine: Engine) -> list[float]:
    """Every ``sample_block`` value in key order, flat (the series as its index)."""
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT * FROM sample_block ORDER BY series, block")).all()
    names = sorted({r.series for r in rows})
    return [
        names.index(v) if isinstance(v, str) else (float("nan") if v is None else float(v))
        for r in rows
        for v in r
    ]


def _csv_of_rows(engine: Engine) -> str:
    """The CSV export of the one run's ``sample`` rows, read as revision 0004's code read them
    (a select in seq order, the export's own row format)."""
    from noisescope_server.queries._raw import CSV_COLUMNS, _csv_row

    with engine.connect() as conn:
        rows = conn.execute(text(f"SELECT {', '.join(CSV_COLUMNS)} FROM sample ORDER BY seq"))
        lines = [",".join(CSV_COLUMNS)]
        lines += [",".join(str(v) for v in _csv_row(tuple(r))) for r in rows]
    return "\n".join(lines) + "\n"
