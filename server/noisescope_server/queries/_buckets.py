"""Bucketed raw sums of several runs and series in one query (the comparisons and the sweep
analysis read these)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Engine,
    Numeric,
    and_,
    case,
    cast,
    false,
    func,
    literal,
    select,
    union_all,
)

from noisescope import protocol
from noisescope_server.models import BLOCK_SIZE, WHOLE_MODEL, Run, Sample, SampleBlock, Series
from noisescope_server.queries._common import archived_filter
from noisescope_server.queries._decoded import bucket_rows
from noisescope_server.queries._samples import ESTIMATE_SQL, summed_in_sql


@dataclass(frozen=True)
class BucketSums:
    """One bucket of one (run, series): raw sums, so that smoothing stays the reader's choice.

    Buckets split each (run, series) step range evenly. ``step_lo`` is the bucket's first
    step, ``step`` and ``examples`` its last, ``time`` its last sample's seconds since the
    series' first, ``loss`` and ``lr`` means over the samples that had one, ``batch_size`` the
    largest B_big (the batch in use).
    """

    run_uid: str
    series: str
    bucket: int
    n: int
    sum_g_sq: float
    sum_trace_sigma: float
    step_lo: int
    step: int
    examples: float | None
    time: float | None
    loss: float | None
    lr: float | None
    batch_size: float | None
    #: The samples ``loss`` is the mean of (those that carried a loss).
    n_loss: int
    #: Whether the run was read from its blocks (``min_blocks`` of them or more), not its samples.
    from_blocks: bool


#: A run is read from the server's ``sample_block`` sums (``BLOCK_SIZE`` samples each; a
#: 1M-sample run is ~16k rows, not 1M) once it has at least this many blocks per requested
#: point, otherwise from ``sample`` itself, so short runs keep per-step resolution.
BLOCKS_PER_POINT = 1.0


#: The ``sample_block`` columns bucketing reads, with the names it reads them under.
_READ = {
    "step_min": "step_lo",
    "step_max": "step_hi",
    "n": "n",
    "sum_g_sq": "sum_g_sq",
    "sum_trace_sigma": "sum_trace_sigma",
    "n_loss": "n_loss",
    "sum_loss": "sum_loss",
    "n_lr": "n_lr",
    "sum_lr": "sum_lr",
    "examples_max": "examples_max",
    "time_min": "time_min",
    "time_max": "time_max",
    "b_big_max": "b_big_max",
}
_AGGREGATES = {column: (how, name) for column, how, name in protocol.BLOCK_AGGREGATES}


def _of_one_sample(column: str) -> Any:
    """A ``sample_block`` column over one sample (the field table's aggregate of a block of
    one): a count is 1 where the field is not null, a sum or an extreme the value itself."""
    how, name = _AGGREGATES[column]
    value = ESTIMATE_SQL[name] if name in ESTIMATE_SQL else getattr(Sample, name)
    if how != "count":
        return value
    if protocol.FIELDS_BY_NAME[name].nullable:
        return case((value.is_(None), 0), else_=1)
    return literal(1, BigInteger)


def _sample_rows() -> Any:
    """Per-sample rows in the same shape as ``_block_rows`` (a sample is a block of one)."""
    s = Sample
    read = [_of_one_sample(c).label(label) for c, label in _READ.items()]
    return select(s.run_id, Series.name.label("series"), *read).join(
        Series, and_(Series.run_id == s.run_id, Series.id == s.series_id)
    )


def _block_rows() -> Any:
    """A run's blocks with its series' names (``models.Series``)."""
    b = SampleBlock
    read = [getattr(b, c).label(label) for c, label in _READ.items()]
    return select(b.run_id, Series.name.label("series"), *read).join(
        Series, and_(Series.run_id == b.run_id, Series.id == b.series_id)
    )


def _sizes(conn: Connection, run_ids: Sequence[int]) -> dict[int, int]:
    """Whole-model sample count per run, from the block table (cheap at any run length)."""
    q = (
        select(SampleBlock.run_id, func.sum(SampleBlock.n))
        .where(SampleBlock.series_id == WHOLE_MODEL, SampleBlock.run_id.in_(list(run_ids)))
        .group_by(SampleBlock.run_id)
    )
    return {int(r): int(n or 0) for r, n in conn.execute(q)}


def _reads_blocks(n_samples: int, min_blocks: float) -> bool:
    """Whether ``bucket_sums`` reads a run of ``n_samples`` whole-model samples from its
    blocks: once it has ``min_blocks`` of them, buckets of whole blocks are still at least as
    fine as the caller asked for."""
    return n_samples >= BLOCK_SIZE * min_blocks


def _bucket_source(
    conn: Connection, run_ids: Sequence[int], series: Sequence[str], min_blocks: float
) -> tuple[Any, list[int], list[int]]:
    """Sample rows for short runs SQL can sum (``_samples.summed_in_sql``) and block rows for
    long ones (``_reads_blocks``), as one subquery; the runs read from their blocks; and the
    other short runs (``_decoded.bucket_rows`` sums them)."""
    sizes = _sizes(conn, run_ids)
    small: list[int] = []
    big: list[int] = []
    for r in run_ids:
        (big if _reads_blocks(sizes.get(r, 0), min_blocks) else small).append(r)
    in_sql = summed_in_sql(conn, small)
    packed = sorted(r for r in small if r not in in_sql)  # summed in Python
    small = [r for r in small if r in in_sql]
    parts: list[Any] = []
    if small:
        parts.append(_sample_rows().where(Sample.run_id.in_(small), Series.name.in_(series)))
    if big:
        parts.append(_block_rows().where(SampleBlock.run_id.in_(big), Series.name.in_(series)))
    if not parts:
        parts.append(_sample_rows().where(false()))
    combined: Any = parts[0] if len(parts) == 1 else union_all(parts[0], parts[1])
    return combined.subquery("rows"), big, packed


def bucket_sums(
    engine: Engine,
    run_uids: Sequence[str],
    *,
    series: Sequence[str] = ("",),
    max_points: int = 2000,
    min_blocks: float | None = None,
    project_scope: int | None = None,
    archived: str = "include",
) -> list[BucketSums]:
    """Bucketed sums for several runs and series in one query, at most ``max_points`` each.

    Runs with at least ``min_blocks`` pre-summed blocks (default: one per requested point) are
    read from ``sample_block``; comparisons of many runs accept coarser buckets for speed.
    Unknown runs, and runs outside ``project_scope``, are left out; so are archived runs when
    ``archived`` is "exclude" (``queries._common.archived_filter``).
    """
    if not run_uids:
        return []
    max_points = max(1, int(max_points))
    with engine.connect() as conn:
        known = select(Run.id, Run.uid).where(
            Run.uid.in_(list(run_uids)), archived_filter(archived)
        )
        if project_scope is not None:
            known = known.where(Run.project_id == project_scope)
        uid_of = {int(i): str(uid) for i, uid in conn.execute(known)}
        rows, read_from_blocks, packed = _bucket_source(
            conn,
            list(uid_of),
            list(series),
            max_points * BLOCKS_PER_POINT if min_blocks is None else min_blocks,
        )
        stats = (
            select(
                rows.c.run_id,
                rows.c.series,
                func.min(rows.c.step_lo).label("mn"),
                func.max(rows.c.step_hi).label("mx"),
                func.min(rows.c.time_min).label("t0"),
            )
            .group_by(rows.c.run_id, rows.c.series)
            .subquery("stats")
        )
        # integer floor division (SQLAlchemy's //): a CAST of true division rounds on
        # PostgreSQL, which made max_points + 1 uneven buckets there. In NUMERIC there: steps
        # near 2^63 times max_points overflow bigint (SQLite makes such a product a REAL)
        offset, span = rows.c.step_lo - stats.c.mn, stats.c.mx - stats.c.mn
        if conn.dialect.name == "postgresql":
            offset, span = cast(offset, Numeric), cast(span, Numeric)
        bucket = (offset * max_points // (span + 1)).label("bucket")
        q = (
            select(
                Run.uid.label("run"),
                rows.c.series,
                bucket,
                func.sum(rows.c.n).label("n"),
                func.sum(rows.c.sum_g_sq).label("sum_g_sq"),
                func.sum(rows.c.sum_trace_sigma).label("sum_trace_sigma"),
                func.min(rows.c.step_lo).label("step_lo"),
                func.max(rows.c.step_hi).label("step"),
                func.max(rows.c.examples_max).label("examples"),
                (func.max(rows.c.time_max) - func.min(stats.c.t0)).label("time"),
                (func.sum(rows.c.sum_loss) / func.nullif(func.sum(rows.c.n_loss), 0)).label("loss"),
                (func.sum(rows.c.sum_lr) / func.nullif(func.sum(rows.c.n_lr), 0)).label("lr"),
                func.max(rows.c.b_big_max).label("batch_size"),
                func.coalesce(func.sum(rows.c.n_loss), 0).label("n_loss"),
            )
            .join(
                stats,
                and_(stats.c.run_id == rows.c.run_id, stats.c.series == rows.c.series),
            )
            .join(Run, Run.id == rows.c.run_id)
            .group_by(Run.uid, rows.c.series, bucket)
            .order_by(Run.uid, rows.c.series, bucket)
        )
        found: list[Any] = list(conn.execute(q))
        for run_id in packed:
            found += bucket_rows(conn, run_id, uid_of[run_id], list(series), max_points)
        if packed:
            found.sort(key=lambda row: (str(row[0]), str(row[1]), int(row[2])))
        block_uids = {uid_of[i] for i in read_from_blocks}
        return [_bucket_sums(row, block_uids) for row in found]


def _opt(value: Any) -> float | None:
    return None if value is None else float(value)


def _bucket_sums(row: Any, block_uids: set[str]) -> BucketSums:
    """Plain Python numbers: PostgreSQL returns sums of integers as Decimal."""
    (uid, series, bucket, n, g_sq, trace_sigma, step_lo, step, examples, time, loss, lr, batch,
     n_loss) = row  # fmt: skip
    return BucketSums(
        str(uid),
        str(series),
        int(bucket),
        int(n),
        float(g_sq),
        float(trace_sigma),
        int(step_lo),
        int(step),
        _opt(examples),
        _opt(time),
        _opt(loss),
        _opt(lr),
        _opt(batch),
        int(n_loss),
        str(uid) in block_uids,
    )
