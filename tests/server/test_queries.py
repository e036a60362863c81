"""The read side's several-runs query on both backends: exact sums per bucket, block and
sample sources agreeing, unknown runs and other projects left out; a long run's current window
read from its blocks."""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import Engine, select

from harness.payloads import columns, expected_sums
from noisescope.estimators import CURRENT_FRACTION, CURRENT_RAW_LIMIT, current_window
from noisescope_server import crud, db, queries
from noisescope_server.models import BLOCK_SIZE, WHOLE_MODEL, SampleBlock
from noisescope_server.queries._compare import COMPARE_MIN_BLOCKS


def _engine_with_runs(db_url: str) -> tuple[Engine, dict[str, dict[str, list[Any]]], int]:
    """Runs "a" (1000 samples) and "b" (300) in project p, "c" in project q; p's id."""
    engine = db.make_engine(db_url)
    db.upgrade(engine)
    data: dict[str, dict[str, list[Any]]] = {}
    project_p = 0
    for uid, project, n in (("a", "p", 1000), ("b", "p", 300), ("c", "q", 200)):
        ref, _ = crud.upsert_run(engine, uid, crud.RunIn(project=project, task="t", batch_size=32))
        if project == "p":
            project_p = ref.project_id
        data[uid] = columns(n, seed=len(data))
        if uid == "b":  # a run whose loss is logged on every third step only
            data[uid]["loss"] = [v if i % 3 == 0 else None for i, v in enumerate(data[uid]["loss"])]
        crud.ingest_samples(engine, uid, crud.validate_samples({"columns": data[uid]}))
    return engine, data, project_p


def test_bucket_sums_are_exact_per_run_from_samples_and_from_blocks(db_url: str) -> None:
    engine, data, _ = _engine_with_runs(db_url)
    uids = ["a", "b", "c", "no-such-run"]
    from_samples = queries.bucket_sums(engine, uids, max_points=10, min_blocks=math.inf)
    from_blocks = queries.bucket_sums(engine, uids, max_points=10, min_blocks=1)
    assert {b.run_uid for b in from_samples} == {"a", "b", "c"}
    for buckets in (from_samples, from_blocks):
        for uid, cols in data.items():
            mine = [b for b in buckets if b.run_uid == uid]
            assert 0 < len(mine) <= 10
            assert [b.bucket for b in mine] == sorted(b.bucket for b in mine)
            g_total, s_total = expected_sums(cols)
            assert sum(b.n for b in mine) == len(cols["step"])
            assert math.isclose(sum(b.sum_g_sq for b in mine), g_total, rel_tol=1e-9)
            assert math.isclose(sum(b.sum_trace_sigma for b in mine), s_total, rel_tol=1e-9)
            assert mine[-1].step == cols["step"][-1]
            # each bucket's loss is the mean over the samples that carried one, and says how many
            assert sum(b.n_loss for b in mine) == sum(v is not None for v in cols["loss"])
            losses = [v for v in cols["loss"] if v is not None]
            assert math.isclose(
                sum((b.loss or 0.0) * b.n_loss for b in mine), sum(losses), rel_tol=1e-9
            )
            assert mine[-1].batch_size == 32.0
    # each bucket says which source its run was read from
    assert all(b.from_blocks for b in from_blocks) and not any(b.from_blocks for b in from_samples)
    # block buckets hold whole blocks of 64: their sample counts are multiples of it
    sample_counts = [b.n for b in from_blocks if b.run_uid == "a"]
    assert all(n % BLOCK_SIZE == 0 for n in sample_counts[:-1])
    assert [b.n for b in from_samples if b.run_uid == "a"] == [100] * 10


def test_compared_runs_say_whether_they_were_read_from_their_blocks(db_url: str) -> None:
    engine = db.make_engine(db_url)
    db.upgrade(engine)
    enough = COMPARE_MIN_BLOCKS * BLOCK_SIZE  # whole-model samples to be read from blocks
    for uid, n in (("long", enough), ("short", enough - 1)):
        crud.upsert_run(engine, uid, crud.RunIn(project="p", task="t", batch_size=32))
        crud.ingest_samples(engine, uid, crud.validate_samples({"columns": columns(n, seed=n)}))
    compared = queries.compare_series(engine, ["long", "short"])
    assert [(s.run_uid, s.n_samples, s.source) for s in compared] == [
        ("long", enough, "blocks"),
        ("short", enough - 1, "samples"),
    ]


def test_bucket_sums_leave_out_runs_outside_the_project_scope(db_url: str) -> None:
    engine, _, project_p = _engine_with_runs(db_url)
    scoped = queries.bucket_sums(engine, ["a", "c"], max_points=5, project_scope=project_p)
    assert {b.run_uid for b in scoped} == {"a"}
    assert queries.bucket_sums(engine, [], max_points=5) == []


def test_a_long_run_s_current_window_is_its_trailing_whole_blocks_when_blocks_are_partial(
    db_url: str,
) -> None:
    """A window past ``CURRENT_RAW_LIMIT`` samples is whole 64-sample blocks, read newest first
    a page at a time: with blocks holding 16 to 64 samples (gaps in seq) and layer samples in
    between, it is still ``estimators.current_window`` over all of the run's blocks."""
    engine = db.make_engine(db_url)
    db.upgrade(engine)
    crud.upsert_run(engine, "long", crud.RunIn(project="p", task="t", batch_size=32))
    cols = columns(80_000, seed=3)
    keep = [
        i
        for i, seq in enumerate(cols["seq"])
        if seq % BLOCK_SIZE < (16, 40, 64)[seq // BLOCK_SIZE % 3]
    ]
    whole = {name: [values[i] for i in keep] for name, values in cols.items()}
    layer = columns(2_000, seed=4, series="layer0")
    for part in (whole, layer):
        for lo in range(0, len(part["seq"]), 10_000):
            chunk = {name: values[lo : lo + 10_000] for name, values in part.items()}
            crud.ingest_samples(engine, "long", crud.validate_samples({"columns": chunk}))
    with engine.connect() as conn:  # every block of the whole-model series, oldest first
        where = SampleBlock.series_id == WHOLE_MODEL
        blocks = conn.execute(select(SampleBlock).where(where).order_by(SampleBlock.block)).all()
    assert CURRENT_FRACTION * len(keep) > CURRENT_RAW_LIMIT  # read as blocks
    assert len({b.n for b in blocks}) > 2  # partial blocks of several sizes
    k, window = current_window(
        [float(b.n) for b in blocks],
        [b.sum_g_sq for b in blocks],
        [b.sum_trace_sigma for b in blocks],
    )
    interval = window.interval
    run = queries.get_run(engine, "long")
    assert interval.b_simple is not None and k < len(blocks)
    assert run.window_samples == sum(b.n for b in blocks[-k:])
    assert (run.b_simple, run.b_simple_lo, run.b_simple_hi) == (
        interval.b_simple.value,
        interval.b_simple.lo,
        interval.b_simple.hi,
    )
    assert (run.window_first_step, run.window_last_step) == (
        blocks[-k].step_min,
        blocks[-1].step_max,
    )
    assert queries.list_runs(engine) == [run]
