"""Compaction on both backends: a run's samples moved into compressed chunks read back the same
through every read (CSV byte for byte, series, buckets, the run summary, branch points), a late
sample is stored once and read with the rest, and the chunk encoding is lossless."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, update

from harness.payloads import columns
from noisescope_server import crud, db, queries
from noisescope_server.chunks import decode_chunk, encode_chunk
from noisescope_server.models import WHOLE_MODEL, RunDigest, Sample, SampleBlock, SampleChunk
from noisescope_server.queries._branches import _examples_at


@pytest.fixture
def engine(db_url: str) -> Engine:
    e = db.make_engine(db_url)
    db.upgrade(e)
    return e


def _holes(cols: dict[str, list[Any]], seed: int) -> dict[str, list[Any]]:
    """Nulls where a real run has them: loss and lr on some steps, no examples or time on
    others, a -0.0 loss."""
    rng = random.Random(seed)
    out = {k: list(v) for k, v in cols.items()}
    for name in ("loss", "lr", "examples", "time"):
        out[name] = [None if rng.random() < 0.2 else v for v in out[name]]
    out["loss"][3] = -0.0
    return out


def _fill(engine: Engine, uid: str, n: int = 700) -> None:
    """A run of a whole-model series and two layers, interleaved in seq as a probe logs them,
    sent in a few batches."""
    crud.upsert_run(engine, uid, crud.RunIn(project="p", task="t", batch_size=32))
    names = ["", "layer.h.0.mlp.c_fc.weight", "layer.h.1.attn.c_attn.weight"]
    for start in range(0, n, 250):
        rows = min(250, n - start)
        for k, name in enumerate(names):
            cols = _holes(columns(rows, start=start, seed=k, series=name), start + k)
            cols["seq"] = [3 * s + k for s in cols["seq"]]
            crud.ingest_samples(engine, uid, crud.validate_samples({"columns": cols}))


def _reads(engine: Engine, uid: str) -> dict[str, Any]:
    """Every read of individual samples."""
    out: dict[str, Any] = {"csv": "".join(queries.raw_samples_csv(engine, uid, chunk_rows=333))}
    out["csv_layer"] = "".join(
        queries.raw_samples_csv(engine, uid, series="layer.h.0.mlp.c_fc.weight")
    )
    for x in ("step", "examples", "time"):
        for series in ("", "layer.h.1.attn.c_attn.weight"):
            out[f"series_{x}_{series}"] = queries.run_series(
                engine, uid, x=x, series=series, max_points=50
            )
    out["smoothed"] = queries.run_series(engine, uid, window=40.0, max_points=100)
    out["blocks"] = queries.run_series(engine, uid, max_points=4)  # long enough for blocks
    out["names"] = queries.series_names(engine, uid)
    out["buckets"] = queries.bucket_sums(
        engine, [uid], series=["", "layer.h.0.mlp.c_fc.weight"], max_points=37
    )
    out["tasks"] = queries.task_summaries(engine)
    summary = queries.get_run(engine, uid)
    out["summary"] = {k: v for k, v in vars(summary).items() if k != "status"}
    with engine.connect() as conn:
        run_id = conn.execute(select(SampleBlock.run_id).limit(1)).scalar_one()
        out["examples_at"] = [_examples_at(conn, run_id, step) for step in (0, 5, 300, 699)]
    return out


def _block_totals(engine: Engine, uid: str) -> list[Any]:
    """Per series (by its number): samples, the sums and the step range over all its blocks."""
    b = SampleBlock
    with engine.connect() as conn:
        return [
            tuple(row)
            for row in conn.execute(
                select(
                    b.series_id,
                    func.sum(b.n),
                    func.sum(b.sum_g_sq),
                    func.sum(b.sum_trace_sigma),
                    func.sum(b.n_loss),
                    func.sum(b.sum_loss),
                    func.min(b.step_min),
                    func.max(b.step_max),
                    func.max(b.examples_max),
                )
                .where(b.run_id == _run_id(engine, uid))
                .group_by(b.series_id)
                .order_by(b.series_id)
            )
        ]


def _count(engine: Engine, table: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def _same(before: dict[str, Any], after: dict[str, Any]) -> None:
    assert after["csv"] == before["csv"]  # byte for byte
    for key in before:
        assert _flat(after[key]) == pytest.approx(_flat(before[key]), rel=1e-12), key


def _flat(value: Any) -> list[Any]:
    """A read as a flat list of its numbers and (as their hash) everything else, for approx."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _flat(dataclasses.astuple(value))
    if isinstance(value, dict):
        return _flat(sorted(value.items(), key=lambda kv: str(kv[0])))
    if isinstance(value, (list, tuple)):
        return [v for item in value for v in _flat(item)]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return [hash(value)]
    if isinstance(value, (int, float)):
        return [value]
    return [hash(repr(value))]


def test_a_compacted_run_reads_the_same(engine: Engine) -> None:
    _fill(engine, "r1")
    before = _reads(engine, "r1")
    totals = _block_totals(engine, "r1")
    blocks_before = _count(engine, SampleBlock)
    assert before["series_step_"].source == "samples"
    assert before["blocks"].source == "blocks"
    run_id = _run_id(engine, "r1")
    done = crud.compact_run(engine, run_id, chunk_rows=128)
    assert done.samples == 2100
    assert done.chunks == 3 * -(-700 // 128)
    assert _count(engine, Sample) == 0
    assert _count(engine, SampleChunk) == done.chunks
    _same(before, _reads(engine, "r1"))
    assert _flat(_block_totals(engine, "r1")) == pytest.approx(_flat(totals), rel=1e-12)
    # the layers' seq blocks held about 21 samples each; now 64 at a time (up to a chunk's end)
    assert _count(engine, SampleBlock) < blocks_before * 0.6
    assert crud.compact_run(engine, run_id).samples == 0  # nothing left to move


def test_late_samples_of_a_compacted_run_are_stored_once(engine: Engine) -> None:
    """A resend of what the chunks hold changes nothing; samples inside the compacted range and
    after it are stored once; the run reads as one that never was compacted."""
    whole, layer = columns(900, seed=3), columns(900, seed=4, series="layer.0")
    full = {k: [x for pair in zip(whole[k], layer[k], strict=True) for x in pair] for k in whole}
    full["seq"] = list(range(1800))  # the layer's sample after each whole-model one
    reference, late = "reference", "late"
    for uid in (reference, late):
        crud.upsert_run(engine, uid, crud.RunIn(project="p", task="t", batch_size=32))
    crud.ingest_samples(engine, reference, crud.validate_samples({"columns": full}))

    def part(keep: Any) -> dict[str, Any]:
        idx = [i for i in range(1800) if keep(i // 2)]
        return {k: [v[i] for i in idx] for k, v in full.items()}

    first = part(lambda i: i < 600 and i % 7 != 0)  # holes inside the compacted range
    crud.ingest_samples(engine, late, crud.validate_samples({"columns": first}))
    crud.compact_run(engine, _run_id(engine, late), chunk_rows=100)
    assert _count(engine, Sample) == 1800  # the reference run's rows only
    # the whole run again: only the holes and the tail are new
    new = crud.ingest_samples(engine, late, crud.validate_samples({"columns": full}))
    assert new == 1800 - len(first["seq"])
    again = crud.ingest_samples(engine, late, crud.validate_samples({"columns": full}))
    assert again == 0
    # the digest stored at the first compaction is stale now: not read
    assert _reads_of_one(engine, late) == _reads_of_one(engine, reference)
    assert _flat(_block_totals(engine, late)) == pytest.approx(
        _flat(_block_totals(engine, reference)), rel=1e-12
    )
    crud.compact_run(engine, _run_id(engine, late), chunk_rows=100)
    assert _count(engine, Sample) == 1800
    ref, got = _reads_of_one(engine, reference), _reads_of_one(engine, late)
    assert got == ref
    assert _flat(_block_totals(engine, late)) == pytest.approx(
        _flat(_block_totals(engine, reference)), rel=1e-12
    )
    with engine.connect() as conn:
        blocks = {
            uid: [
                tuple(row)
                for row in conn.execute(
                    select(*[c for c in SampleBlock.__table__.columns if c.name != "run_id"])
                    .where(
                        SampleBlock.run_id == _run_id(engine, uid),
                        SampleBlock.series_id == WHOLE_MODEL,
                    )
                    .order_by(SampleBlock.block)
                )
            ]
            for uid in (reference, late)
        }
    # the whole-model series' seq blocks are the same (a layer's are summed differently)
    assert _flat(blocks[late]) == pytest.approx(_flat(blocks[reference]), rel=1e-12)


def _reads_of_one(engine: Engine, uid: str) -> tuple[Any, ...]:
    csv = "".join(queries.raw_samples_csv(engine, uid))
    series = queries.run_series(engine, uid, max_points=100)
    return csv, series.n_samples, len(series.points), queries.get_run(engine, uid).b_simple


def _run_id(engine: Engine, uid: str) -> int:
    from noisescope_server.models import Run

    with engine.connect() as conn:
        return int(conn.execute(select(Run.id).where(Run.uid == uid)).scalar_one())


def test_runs_to_compact_are_finished_or_quiet(engine: Engine) -> None:
    for uid in ("live", "done", "empty"):
        crud.upsert_run(engine, uid, crud.RunIn(project="p", task="t"))
    for uid in ("live", "done"):
        crud.ingest_samples(engine, uid, crud.validate_samples({"columns": columns(10)}))
    crud.patch_run(engine, "done", status="finished")
    crud.patch_run(engine, "empty", status="finished")
    assert crud.runs_to_compact(engine) == []  # just finished: its last flush may follow
    assert crud.runs_to_compact(engine, finished_after=0.0) == [_run_id(engine, "done")]
    quiet = crud.runs_to_compact(engine, quiet_after=0.0)  # every run counts as quiet
    assert quiet == [_run_id(engine, "live"), _run_id(engine, "done")]
    crud.compact_run(engine, _run_id(engine, "done"))
    assert crud.runs_to_compact(engine, finished_after=0.0) == []


def test_deleting_a_compacted_run_deletes_its_chunks(engine: Engine) -> None:
    _fill(engine, "gone", n=100)
    crud.compact_run(engine, _run_id(engine, "gone"))
    assert _count(engine, SampleChunk) > 0
    assert _count(engine, RunDigest) == 1
    crud.delete_run(engine, "gone")
    assert _count(engine, SampleChunk) == 0
    assert _count(engine, RunDigest) == 0


@pytest.mark.parametrize("seed", range(5))
def test_the_chunk_encoding_is_lossless(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(1, 300)
    specials = [0.0, -0.0, 5e-324, -1e308, 1e308, 1.5, -2.25]

    def number() -> float:
        return rng.choice(specials) if rng.random() < 0.3 else rng.uniform(-1e6, 1e6)

    cols: dict[str, list[Any]] = {
        "seq": sorted(rng.sample(range(-(2**40), 2**40), n)),
        "step": [rng.choice([-(2**63), 2**63 - 1, 0, rng.randint(-5, 5)]) for _ in range(n)],
    }
    for name in ("examples", "b_small", "b_big", "g_small_sq", "g_big_sq", "loss", "lr", "time"):
        nullable = name in ("examples", "loss", "lr", "time")
        all_null = nullable and rng.random() < 0.2
        cols[name] = [
            None if all_null or (nullable and rng.random() < 0.3) else number() for _ in range(n)
        ]
    back = decode_chunk(encode_chunk(cols))
    assert back == cols
    for name, values in cols.items():  # -0.0 == 0.0: compare the bits too
        assert [repr(v) for v in back[name]] == [repr(v) for v in values]


def test_a_digest_of_other_fields_is_read_again(engine: Engine) -> None:
    """A digest stored by a version whose current window had other fields is not used: the
    window is read again (and one of this version's is used: its numbers come back)."""
    _fill(engine, "old-digest", n=300)
    truth = queries.get_run(engine, "old-digest")
    crud.compact_run(engine, _run_id(engine, "old-digest"))
    assert queries.get_run(engine, "old-digest") == truth
    with engine.begin() as conn:
        conn.execute(update(RunDigest).values(current='{"b_simple": 1.0}', last_loss=7.0))
    assert queries.get_run(engine, "old-digest") == truth
    assert [t.b_simple_median for t in queries.task_summaries(engine)] == [truth.b_simple]
