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
from harness.old_rows import dump, old_run, old_samples, populate
from noisescope import protocol
from noisescope.estimators import two_batch_estimates
from noisescope_server import chunks, crud, db, queries
from noisescope_server.models import Base

TABLES = {
    "project", "task", "run", "sample", "sample_block", "sample_chunk", "run_digest", "event",
    "token", "deleted_run", "series",
}  # fmt: skip
#: The tables ``_populate`` fills (a run is compacted, filling the others, only when asked;
#: deleted_run exists from 0005 on, series from 0007 on).
FILLED = TABLES - {"sample_chunk", "run_digest", "deleted_run", "series"}


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
    """``crud.ingest_samples``, or, below revision 0007 (names and estimates in every row),
    its rows and blocks written as those revisions stored them."""
    if "series" in _tables(engine):
        crud.ingest_samples(engine, uid, batch)
    else:
        old_samples(engine, uid, batch)


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


LAYERS = ("layer.transformer.h.3.mlp.c_fc.weight", "layer.transformer.h.3.attn.c_proj.weight")


def _samples_of_a_run() -> list[dict[str, list[Any]]]:
    """The whole model and two layers, interleaved by seq, some losses and lrs null."""
    out = []
    for k, name in enumerate(("", *LAYERS)):
        cols = columns(150, seed=k, series=name)
        cols["seq"] = [3 * s + k for s in cols["seq"]]
        cols["loss"] = [None if i % 3 == k else v for i, v in enumerate(cols["loss"])]
        cols["lr"] = [None if i % 5 == 0 else 1e-3 / (i + 1) for i in range(150)]
        out.append(cols)
    return out


def _store_at_0006(engine: Engine) -> None:
    """Two runs as revision 0006 stored them: "live" as rows, "packed" with the samples of
    each series in a chunk (as 0006's compaction left them; a layer's seq blocks kept: the
    conversion copies blocks as they are), each with the whole model and two layers,
    interleaved, some losses and lrs null."""
    for uid in ("live", "packed"):
        old_run(engine, uid, project=uid)
        for cols in _samples_of_a_run():
            old_samples(engine, uid, crud.validate_samples({"columns": cols}))
    wire = [c for c in protocol.STORED_COLUMNS if c != "series"]
    with engine.begin() as conn:
        run_id = conn.execute(text("SELECT id FROM run WHERE uid = 'packed'")).scalar_one()
        for name in ("", *LAYERS):
            found = conn.execute(
                text(f"SELECT {', '.join(wire)} FROM sample WHERE run_id = :r AND series = :s "
                     "ORDER BY seq"),
                {"r": run_id, "s": name},
            ).all()  # fmt: skip
            cols = {c: [r[i] for r in found] for i, c in enumerate(wire)}
            chunk = {"r": run_id, "s": name, "lo": cols["seq"][0], "hi": cols["seq"][-1]}
            conn.execute(
                text("INSERT INTO sample_chunk (run_id, series, seq_first, seq_last, n, data) "
                     "VALUES (:r, :s, :lo, :hi, :n, :data)"),
                {**chunk, "n": len(found), "data": chunks.encode_chunk(cols)},
            )  # fmt: skip
            conn.execute(text("DELETE FROM sample WHERE run_id = :r AND series = :s"), chunk)


def _csv_at_0006(engine: Engine, uid: str, series: str | None = None) -> str:
    """A run's CSV export as revision 0006's code read it: its rows as stored (names and
    estimates in each), its chunks decoded (estimates by ``estimators.two_batch_estimates``,
    as ingest computed them), merged by seq, in the export's own row format."""
    from noisescope_server.queries._raw import CSV_COLUMNS, _csv_row

    where, params = "r.uid = :u", {"u": uid, "s": series}
    if series is not None:
        where += " AND t.series = :s"
    with engine.connect() as conn:
        rows = conn.execute(
            text(f"SELECT {', '.join(f't.{c}' for c in CSV_COLUMNS)} FROM sample t "
                 f"JOIN run r ON r.id = t.run_id WHERE {where}"),
            params,
        ).all()  # fmt: skip
        found = [tuple(r) for r in rows]
        packed = conn.execute(
            text("SELECT t.series, t.data FROM sample_chunk t JOIN run r ON r.id = t.run_id "
                 f"WHERE {where}"),
            params,
        ).all()  # fmt: skip
    for name, data in packed:
        cols: dict[str, list[Any]] = dict(chunks.decode_chunk(bytes(data)))
        n = len(cols["seq"])
        estimates = [two_batch_estimates(*args) for args in zip(
            cols["b_small"], cols["b_big"], cols["g_small_sq"], cols["g_big_sq"], strict=True
        )]  # fmt: skip
        cols["g_sq_est"] = [e[0] for e in estimates]
        cols["trace_sigma_est"] = [e[1] for e in estimates]
        cols["series"] = [name] * n
        found += list(zip(*(cols[c] for c in CSV_COLUMNS), strict=True))
    found.sort(key=lambda r: int(str(r[0])))
    lines = [",".join(CSV_COLUMNS)] + [",".join(str(v) for v in _csv_row(r)) for r in found]
    return "\n".join(lines) + "\n"


def _named_blocks(engine: Engine) -> list[tuple[object, ...]]:
    """Every ``sample_block`` row with its run's uid and its series' name (as stored at 0006,
    or through the ``series`` table from 0007 on), in key order."""
    named = "series" in _tables(engine)
    name = "s.name" if named else "b.series"
    join = " JOIN series s ON s.run_id = b.run_id AND s.id = b.series_id" if named else ""
    rest = ", ".join(f"b.{c}" for c in protocol.BLOCK_COLUMNS[1:])
    with engine.connect() as conn:
        rows = conn.execute(
            text(f"SELECT r.uid, {name}, {rest} FROM sample_block b "
                 f"JOIN run r ON r.id = b.run_id{join}")
        ).all()  # fmt: skip
    return sorted((tuple(r) for r in rows), key=lambda r: (r[0], r[1], r[2]))


def test_names_once_and_no_stored_estimates_read_the_same_after_0007(db_url: str) -> None:
    """0007 stores each series name once per run and no per-sample estimate: rows and chunks
    stored at 0006 export the same CSV byte for byte after it (the whole run and each series),
    every block holds the same values under the same name, the series list is the same, and a
    run's series reads as the same samples ingested at head read; downgrading gives 0006's
    tables back as they were."""
    engine = db.make_engine(db_url)
    db.upgrade(engine, "0006")
    _store_at_0006(engine)
    uids, names = ("live", "packed"), ("", *LAYERS)
    before = {(u, s): _csv_at_0006(engine, u, s) for u in uids for s in (None, *names)}
    blocks = _named_blocks(engine)
    assert len({b[1] for b in blocks}) == 3 and {b[0] for b in blocks} == set(uids)
    db.upgrade(engine)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM series")).scalar_one() == 6
        columns_now = {c["name"] for c in inspect(conn).get_columns("sample")}
    assert columns_now.isdisjoint({"series", "g_sq_est", "trace_sigma_est"})
    for (uid, series), csv in before.items():
        assert "".join(queries.raw_samples_csv(engine, uid, series=series)) == csv
    assert _named_blocks(engine) == blocks
    for uid in uids:
        assert [(i.name, i.n_samples) for i in queries.series_names(engine, uid)] == [
            (name, 150) for name in sorted(names)
        ]
    # the same samples ingested at head into another run: the same series
    old_run(engine, "twin", project="twin")
    for cols in _samples_of_a_run():
        crud.ingest_samples(engine, "twin", crud.validate_samples({"columns": cols}))
    for name in names:
        got = queries.run_series(engine, "live", series=name)
        want = queries.run_series(engine, "twin", series=name)
        assert (got.n_samples, got.source) == (want.n_samples, "samples")
        assert got.points == want.points  # sample by sample: the same floats
        # from the blocks: 0006 summed the live run's in SQL, ingest now sums with math.fsum
        # (exactly rounded), as the fast path of every revision did: the last bit may differ
        got = queries.run_series(engine, "live", series=name, max_points=4)
        want = queries.run_series(engine, "twin", series=name, max_points=4)
        assert (got.n_samples, got.source) == (want.n_samples, "blocks")
        assert [(p.n, p.step_lo, p.step_hi) for p in got.points] == [
            (p.n, p.step_lo, p.step_hi) for p in want.points
        ]
        sums = [(p.sum_g_sq, p.sum_trace_sigma, p.loss, p.lr) for p in got.points]
        assert sums == [
            pytest.approx((p.sum_g_sq, p.sum_trace_sigma, p.loss, p.lr), rel=1e-13)
            for p in want.points
        ]
    db.downgrade(engine, "0006")
    assert {(u, s): _csv_at_0006(engine, u, s) for u in uids for s in (None, *names)} == before
    assert [b for b in _named_blocks(engine) if b[0] != "twin"] == blocks
    db.upgrade(engine)
    assert "".join(queries.raw_samples_csv(engine, "packed")) == before[("packed", None)]
    engine.dispose()
