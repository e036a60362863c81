"""The write path on both backends: estimates from the estimator module, exact block sums
under re-sends, out-of-order and concurrent batches, one transaction per request."""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Callable

import pytest
from sqlalchemy import Engine, and_, func, select

from harness.payloads import columns, expected_sums
from noisescope import protocol
from noisescope.estimators import two_batch_estimates
from noisescope_server import crud, db, queries
from noisescope_server.crud import _runs, _samples, _sql
from noisescope_server.errors import Forbidden
from noisescope_server.models import SAMPLE_COLUMNS, SERIES_COLUMN, Run, Sample, SampleBlock, Series
from noisescope_server.queries._samples import ESTIMATE_SQL, sample_rows


@pytest.fixture
def engine(db_url: str) -> Engine:
    e = db.make_engine(db_url)
    db.upgrade(e)
    crud.upsert_run(e, "run1", crud.RunIn(project="p", task="t", batch_size=32))
    return e


def _blocks_match_samples(engine: Engine) -> None:
    """Every block holds the sums of its samples as the read seam gives them (the estimates
    derived there), under its series' name."""
    with engine.connect() as conn:
        run_id = conn.execute(select(Run.id).where(Run.uid == "run1")).scalar_one()
        groups: dict[tuple[str, int], list[tuple[float, float, int]]] = {}
        read = ("series", "seq", "g_sq_est", "trace_sigma_est", "step")
        for name, seq, g, s, step in sample_rows(conn, run_id, read):
            groups.setdefault((name, seq // 64), []).append((g, s, step))
        raw = [
            (name, block, len(rows), math.fsum(r[0] for r in rows),
             math.fsum(r[1] for r in rows), min(r[2] for r in rows), max(r[2] for r in rows))
            for (name, block), rows in groups.items()
        ]  # fmt: skip
        blocks = conn.execute(
            select(
                Series.name,
                SampleBlock.block,
                SampleBlock.n,
                SampleBlock.sum_g_sq,
                SampleBlock.sum_trace_sigma,
                SampleBlock.step_min,
                SampleBlock.step_max,
            ).join(
                Series,
                and_(Series.run_id == SampleBlock.run_id, Series.id == SampleBlock.series_id),
            )
        ).all()
    want = {(r[0], int(r[1])): r[2:] for r in raw}
    got = {(r[0], int(r[1])): r[2:] for r in blocks}
    assert want.keys() == got.keys()
    for key, (n, g, s, lo, hi) in want.items():
        gn, gg, gs, glo, ghi = got[key]
        assert int(gn) == n
        assert math.isclose(gg, g, rel_tol=1e-9, abs_tol=1e-9)
        assert math.isclose(gs, s, rel_tol=1e-9, abs_tol=1e-9)
        assert (glo, ghi) == (lo, hi)


def test_estimates_come_from_the_estimator_module() -> None:
    cols = columns(10, seed=5)
    batch = crud.validate_samples({"columns": cols})
    for i in range(10):
        g, s = two_batch_estimates(
            cols["b_small"][i], cols["b_big"][i], cols["g_small_sq"][i], cols["g_big_sq"][i]
        )
        assert batch.g_sq_est[i] == g
        assert batch.trace_sigma_est[i] == s


def test_missing_optional_columns_are_null() -> None:
    cols = {
        k: v
        for k, v in columns(4).items()
        if k in ("seq", "step", "b_small", "b_big", "g_small_sq", "g_big_sq")
    }
    batch = crud.validate_samples({"columns": cols})
    assert batch.columns["loss"] == [None] * 4
    assert batch.columns["series"] == [""] * 4


def test_blocks_stay_exact_under_resends_and_shuffled_batches(engine: Engine) -> None:
    cols = columns(1000, seed=2)
    order = list(range(1000))
    random.Random(0).shuffle(order)
    for start in range(0, 1000, 170):  # shuffled, overlapping batches, each sent twice
        idx = order[start : start + 250]
        part = {k: [v[i] for i in idx] for k, v in cols.items()}
        batch = crud.validate_samples({"columns": part})
        crud.ingest_samples(engine, "run1", batch)
        assert crud.ingest_samples(engine, "run1", batch) == 0
    _blocks_match_samples(engine)
    series = queries.run_series(engine, "run1", max_points=5)
    g_total, s_total = expected_sums(cols)
    assert sum(p.n for p in series.points) == 1000
    assert math.isclose(sum(p.sum_g_sq for p in series.points), g_total, rel_tol=1e-9)
    assert math.isclose(sum(p.sum_trace_sigma for p in series.points), s_total, rel_tol=1e-9)


def _at_once(target: Callable[[int], None], n: int) -> None:
    """``target(0)`` ... ``target(n - 1)``, each on a thread of its own, all joined."""
    threads = [threading.Thread(target=target, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_concurrent_writers_into_one_run_keep_blocks_exact(engine: Engine) -> None:
    """Interleaved seqs from several threads land in the same blocks at the same time."""
    errors: list[BaseException] = []

    def writer(k: int) -> None:
        try:
            for rep in range(5):
                seqs = list(range(k + 4 * 40 * rep, k + 4 * 40 * (rep + 1), 4))
                cols = columns(len(seqs), seed=k)
                cols["seq"] = seqs
                cols["step"] = seqs
                crud.ingest_samples(engine, "run1", crud.validate_samples({"columns": cols}))
        except BaseException as exc:
            errors.append(exc)

    _at_once(writer, 4)
    assert errors == []
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Sample)).scalar_one() == 800
    _blocks_match_samples(engine)


def test_concurrent_run_creation_is_race_safe(engine: Engine) -> None:
    results: list[bool] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def create() -> None:
        try:
            barrier.wait()
            _, created = crud.upsert_run(engine, "raced", crud.RunIn(project="new-p", task="new-t"))
            results.append(created)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=create) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(results) == [False, False, False, True]


def test_failed_request_rolls_back_completely(engine: Engine) -> None:
    batch = crud.validate_samples({"columns": columns(100)})
    with pytest.raises(Forbidden):
        crud.ingest_samples(engine, "run1", batch, project_scope=999)
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Sample)).scalar_one() == 0


def test_incremental_block_sums_across_batch_boundaries(engine: Engine) -> None:
    """In-order batches whose boundaries split blocks take the additive path; nulls included."""
    cols = columns(1000, seed=4)
    cols["loss"][10:300] = [None] * 290
    cols["examples"][0:100] = [None] * 100
    for start in range(0, 1000, 90):  # 90 is not a multiple of the 64-sample block
        part = {k: v[start : start + 90] for k, v in cols.items()}
        batch = crud.validate_samples({"columns": part})
        assert _samples.block_deltas(batch, {"": 0}) is not None
        crud.ingest_samples(engine, "run1", batch)
    _blocks_match_samples(engine)
    with engine.connect() as conn:
        n_loss, sum_loss = conn.execute(
            select(func.sum(SampleBlock.n_loss), func.sum(SampleBlock.sum_loss))
        ).one()
        ex_min = conn.execute(select(func.min(SampleBlock.examples_min))).scalar_one()
    losses = [v for v in cols["loss"] if v is not None]
    assert int(n_loss) == len(losses)
    assert sum_loss is not None
    assert math.isclose(sum_loss, sum(losses), rel_tol=1e-12)
    assert ex_min == cols["examples"][100]


def _block_rows(engine: Engine) -> dict[tuple[int, int], tuple[object, ...]]:
    with engine.connect() as conn:
        rows = conn.execute(select(*(getattr(SampleBlock, c) for c in _sql.BLOCK_COLUMNS)))
        return {(int(r[0]), int(r[1])): tuple(r[2:]) for r in rows}


def test_additive_block_sums_equal_a_recompute_from_the_samples(engine: Engine) -> None:
    """The additive path's shortcuts (one lr, batch sizes and series per request; ascending
    examples and time; nulls) give the blocks the recompute from ``sample`` gives."""
    cols = columns(700, seed=6)
    cols["lr"] = [0.1] * 300 + [0.05] * 200 + [0.1 if s % 2 else 0.2 for s in range(200)]
    cols["time"][400:450] = [None] * 50
    cols["step"][500:520] = list(reversed(cols["step"][500:520]))  # not ascending
    for start in range(0, 700, 100):
        part = {k: v[start : start + 100] for k, v in cols.items()}
        batch = crud.validate_samples({"columns": part})
        assert _samples.block_deltas(batch, {"": 0}) is not None
        assert crud.ingest_samples(engine, "run1", batch) == 100
    additive = _block_rows(engine)
    with db.write_transaction(engine) as conn:
        run_id = _runs.require_run(conn, "run1", None).id
        _samples.refresh_blocks(conn, run_id, cols["seq"])
    recomputed = _block_rows(engine)
    assert additive.keys() == recomputed.keys()
    for key, got in additive.items():
        want = recomputed[key]
        for name, g, w in zip(_sql.BLOCK_COLUMNS[2:], got, want, strict=True):
            if isinstance(w, float) and isinstance(g, float):
                assert math.isclose(g, w, rel_tol=1e-12, abs_tol=1e-12), (key, name, g, w)
            else:
                assert g == w, (key, name, g, w)


def test_multi_row_inserts_store_every_value_and_ignore_resent_rows(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite inserts several rows per statement; 7 per statement exercises the remainders."""
    monkeypatch.setattr(_sql, "SQLITE_ROWS_PER_INSERT", 7)
    cols = columns(150, seed=7, series="layer.0")
    first = {k: v[:100] for k, v in cols.items()}
    again = {k: v[50:] for k, v in cols.items()}
    assert crud.ingest_samples(engine, "run1", crud.validate_samples({"columns": first})) == 100
    assert crud.ingest_samples(engine, "run1", crud.validate_samples({"columns": again})) == 50
    batch = crud.validate_samples({"columns": cols})
    with engine.connect() as conn:
        stored = conn.execute(
            select(*(getattr(Sample, c) for c in SAMPLE_COLUMNS)).order_by(Sample.seq)
        ).all()
    assert len(stored) == 150
    expected = {**batch.columns, SERIES_COLUMN: [1] * 150}  # the run's first layer: 1
    for i, row in enumerate(stored):
        assert tuple(row) == tuple(expected[c][i] for c in SAMPLE_COLUMNS)
    # read back: the name, and the estimates validation computed, derived again
    expected |= {"g_sq_est": batch.g_sq_est, "trace_sigma_est": batch.trace_sigma_est}
    with engine.connect() as conn:
        run_id = conn.execute(select(Run.id).where(Run.uid == "run1")).scalar_one()
        read = sample_rows(conn, run_id, protocol.READ_COLUMNS)
    assert read == [tuple(expected[c][i] for c in protocol.READ_COLUMNS) for i in range(150)]
    _blocks_match_samples(engine)


def test_a_series_name_is_stored_once_per_run(engine: Engine) -> None:
    """Each name once in ``series`` (the whole model's "" as 0, layers numbered as they come);
    rows and blocks carry the number, and every read names the series again."""
    names = ("layer.b", "", "layer.a")
    for start in range(0, 300, 100):
        for k, name in enumerate(names):
            cols = columns(100, start=start, seed=k, series=name)
            cols["seq"] = [3 * s + k for s in cols["seq"]]
            crud.ingest_samples(engine, "run1", crud.validate_samples({"columns": cols}))
    with engine.connect() as conn:
        stored = conn.execute(select(Series.id, Series.name).order_by(Series.id)).all()
        numbers = conn.execute(select(Sample.series_id).distinct()).scalars().all()
        run_id = conn.execute(select(Run.id).where(Run.uid == "run1")).scalar_one()
        read = {name: sample_rows(conn, run_id, ("series", "seq"), series=name) for name in names}
    assert [tuple(r) for r in stored] == [(0, ""), (1, "layer.b"), (2, "layer.a")]
    assert sorted(numbers) == [0, 1, 2]
    for k, name in enumerate(names):
        assert read[name] == [(name, 3 * s + k) for s in range(300)]
    assert [(s.name, s.n_samples) for s in queries.series_names(engine, "run1")] == [
        ("", 300),
        ("layer.a", 300),
        ("layer.b", 300),
    ]
    _blocks_match_samples(engine)


def test_concurrent_ingests_of_new_series_get_one_number_each(engine: Engine) -> None:
    """Ingests of new names into one run at once (PostgreSQL runs them in parallel): each name
    gets one number of its own, and its samples read back under it."""
    names = [f"layer.{i}" for i in range(8)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(names))

    def ingest(k: int) -> None:
        cols = columns(50, seed=k, series=names[k])
        cols["seq"] = [len(names) * s + k for s in cols["seq"]]
        try:
            barrier.wait()
            crud.ingest_samples(engine, "run1", crud.validate_samples({"columns": cols}))
        except BaseException as exc:  # reported below
            errors.append(exc)

    _at_once(ingest, len(names))
    assert errors == []
    with engine.connect() as conn:
        stored = dict(conn.execute(select(Series.name, Series.id)).all())
        run_id = conn.execute(select(Run.id).where(Run.uid == "run1")).scalar_one()
        for k, name in enumerate(names):
            got = sample_rows(conn, run_id, ("seq",), series=name)
            assert got == [(len(names) * s + k,) for s in range(50)]
    assert sorted(stored) == names
    assert sorted(stored.values()) == list(range(1, len(names) + 1))


#: Sizes and squared norms at a float's edges that validation accepts: 1 / b_small overflows
#: to inf, products underflow to 0 (PostgreSQL raises on both; Python and SQLite do not).
EDGES = [
    (1e-310, 1.0, 3.0, 2.0),
    (1e-200, 2e-200, 1e-200, 1e-200),
    (8.0, 32.0, 1e250, 1e-300),
    (3.0, 7.0, 0.0, 5e-324),
    (64.0, 256.0, 1.7, 1.1),
]


def test_estimates_read_as_the_estimators_floats_at_a_floats_edges(engine: Engine) -> None:
    """Samples at a float's edges read back with the estimators' floats (CSV export), their
    series sums too; on SQLite the SQL the short series read sums (``ESTIMATE_SQL``, the
    estimators' one formula as SQL) gives the same floats as Python, bit for bit."""
    n = len(EDGES)
    cols = columns(n, seed=9)
    for name, values in zip(
        ("b_small", "b_big", "g_small_sq", "g_big_sq"), zip(*EDGES, strict=True), strict=True
    ):
        cols[name] = list(values)
    crud.ingest_samples(engine, "run1", crud.validate_samples({"columns": cols}))
    want = [two_batch_estimates(*edge) for edge in EDGES]
    with engine.connect() as conn:
        run_id = conn.execute(select(Run.id).where(Run.uid == "run1")).scalar_one()
        read = sample_rows(conn, run_id, ("g_sq_est", "trace_sigma_est"))
        if engine.dialect.name == "sqlite":
            in_sql = conn.execute(
                select(ESTIMATE_SQL["g_sq_est"], ESTIMATE_SQL["trace_sigma_est"]).order_by(
                    Sample.seq
                )
            ).all()
            assert [tuple(r) for r in in_sql] == want
    assert read == want
    csv = "".join(queries.raw_samples_csv(engine, "run1")).splitlines()
    header = csv[0].split(",")
    at = header.index("g_sq_est"), header.index("trace_sigma_est")
    assert [
        (float(line.split(",")[at[0]]), float(line.split(",")[at[1]])) for line in csv[1:]
    ] == want
    points = queries.run_series(engine, "run1", max_points=n).points
    assert sum(p.n for p in points) == n
    assert math.fsum(p.sum_g_sq for p in points) == pytest.approx(math.fsum(g for g, _ in want))
