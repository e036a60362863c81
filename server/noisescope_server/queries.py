"""The read side, shared by the HTTP query API and the dashboard.

Every function takes an ``Engine`` and returns plain frozen dataclasses (no ORM objects, no
pandas), so callers can cache, serialise (``dataclasses.asdict``) or test them directly.
Signatures are a contract with the dashboard: add keyword arguments, never change existing ones.

Aggregation happens in SQL: a series is bucketed to at most ``max_points`` buckets of *exact*
sums of the per-sample unbiased estimates |𝒢|^2 and 𝒮 (science.md, two-batch estimator);
B_simple = sum 𝒮 / sum |𝒢|^2 and its interval (block jackknife + Fieller) are computed
afterwards by ``noisescope.estimators``. Long runs are read from ``sample_block`` (pre-summed
blocks of 64 consecutive samples maintained at ingest), short ones from ``sample`` directly.

``project_scope`` (a project id) restricts every function to one project; the HTTP layer sets
it from the caller's token. A run outside the scope raises ``crud.Forbidden``.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal

from sqlalchemy import (
    BigInteger,
    Connection,
    Engine,
    Float,
    Integer,
    and_,
    case,
    cast,
    false,
    func,
    literal,
    or_,
    select,
    union_all,
)

from noisescope.estimators import (
    NoiseScale,
    NoiseScaleInterval,
    interval_from_blocks,
    interval_from_steps,
)
from noisescope_server.crud import Forbidden, NotFound
from noisescope_server.models import (
    BLOCK_SIZE,
    SAMPLE_COLUMNS,
    Event,
    Project,
    Run,
    Sample,
    SampleBlock,
    Task,
)

__all__ = [
    "BucketSums",
    "Crossing",
    "EventRow",
    "RunCrossings",
    "RunSeries",
    "RunSummary",
    "SeriesInfo",
    "SeriesPoint",
    "TaskSummary",
    "XAxis",
    "bucket_sums",
    "get_run",
    "list_projects",
    "list_runs",
    "loss_target_crossings",
    "raw_samples_csv",
    "run_events",
    "run_series",
    "series_names",
    "smooth_series",
    "task_summaries",
]

XAxis = Literal["step", "examples", "time"]
X_AXES: tuple[XAxis, ...] = ("step", "examples", "time")
#: Confidence level of every interval the query layer returns.
LEVEL = 0.9
#: Samples in the "current" B_simple window of a run summary.
RECENT_WINDOW = 500
#: Smallest bucket that gets its own interval: a handful of samples cut into sub-blocks says
#: nothing useful, and skipping them keeps short runs' 2000-point series cheap.
MIN_INTERVAL_SAMPLES = 32
#: Sub-buckets per bucket: the blocks a bucket's own jackknife interval is computed from.
_SUB = 4


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return (
        value.replace(tzinfo=timezone.utc)
        if value.tzinfo is None
        else value.astimezone(timezone.utc)
    )


# --- runs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunSummary:
    """One run as listed: metadata, progress, and B_simple over its most recent samples.

    ``b_simple`` is None (with ``b_simple_reason``) while not yet measurable; its interval is
    the ``LEVEL`` (90%) block-jackknife/Fieller interval over the last ``RECENT_WINDOW`` samples.
    """

    uid: str
    project: str
    task: str
    name: str
    tags: list[str]
    config: dict[str, Any]
    batch_size: float | None
    units: str
    status: str
    started_at: datetime | None
    ended_at: datetime | None
    last_seen_at: datetime | None
    n_samples: int
    last_step: int | None
    last_examples: float | None
    last_loss: float | None
    b_simple: float | None
    b_simple_lo: float | None
    b_simple_hi: float | None
    b_simple_reason: str | None
    window_samples: int


def _run_select() -> Any:
    return (
        select(
            Run.id,
            Run.uid,
            Project.name.label("project"),
            Task.name.label("task"),
            Run.name,
            Run.tags,
            Run.config,
            Run.batch_size,
            Run.units,
            Run.status,
            Run.started_at,
            Run.ended_at,
            Run.last_seen_at,
            Run.project_id,
        )
        .join(Project, Project.id == Run.project_id)
        .join(Task, Task.id == Run.task_id)
    )


def _recent_window(
    conn: Connection, run_id: int, window: int
) -> tuple[NoiseScaleInterval | None, NoiseScale | None, int]:
    rows = conn.execute(
        select(Sample.g_sq_est, Sample.trace_sigma_est)
        .where(Sample.run_id == run_id, Sample.series == "")
        .order_by(Sample.seq.desc())
        .limit(window)
    ).all()
    if not rows:
        return None, None, 0
    g_sq = [float(r[0]) for r in reversed(rows)]
    trace_sigma = [float(r[1]) for r in reversed(rows)]
    point = NoiseScale.from_sums(sum(g_sq), sum(trace_sigma), len(g_sq))
    return interval_from_steps(g_sq, trace_sigma, level=LEVEL), point, len(rows)


def _summarise(conn: Connection, row: Any, window: int) -> RunSummary:
    run_id = int(row.id)
    counts = conn.execute(
        select(func.coalesce(func.sum(SampleBlock.n), 0)).where(SampleBlock.run_id == run_id)
    ).scalar_one()
    last = conn.execute(
        select(Sample.step, Sample.examples)
        .where(Sample.run_id == run_id)
        .order_by(Sample.seq.desc())
        .limit(1)
    ).first()
    last_loss = conn.execute(
        select(Sample.loss)
        .where(Sample.run_id == run_id, Sample.loss.is_not(None))
        .order_by(Sample.seq.desc())
        .limit(1)
    ).scalar()
    interval, point, n_window = _recent_window(conn, run_id, window)
    b_iv = interval.b_simple if interval is not None else None
    b_simple: float | None
    lo: float | None
    hi: float | None
    if b_iv is not None:
        b_simple, lo, hi, reason = b_iv.value, b_iv.lo, b_iv.hi, None
    elif point is not None and point.b_simple is not None:
        # Measurable as a point but not significant at LEVEL: give the point, no interval.
        b_simple, lo, hi = point.b_simple, None, None
        reason = interval.reason if interval is not None else None
    else:
        b_simple = lo = hi = None
        reason = (
            (interval.reason if interval is not None else None)
            or (point.reason if point is not None else None)
            or "not yet measurable: no samples"
        )
    return RunSummary(
        uid=str(row.uid),
        project=str(row.project),
        task=str(row.task),
        name=str(row.name),
        tags=list(row.tags or []),
        config=dict(row.config or {}),
        batch_size=row.batch_size,
        units=str(row.units),
        status=str(row.status),
        started_at=_utc(row.started_at),
        ended_at=_utc(row.ended_at),
        last_seen_at=_utc(row.last_seen_at),
        n_samples=int(counts),
        last_step=None if last is None else int(last[0]),
        last_examples=None if last is None or last[1] is None else float(last[1]),
        last_loss=None if last_loss is None else float(last_loss),
        b_simple=b_simple,
        b_simple_lo=lo,
        b_simple_hi=hi,
        b_simple_reason=reason,
        window_samples=n_window,
    )


def list_runs(
    engine: Engine,
    *,
    project: str | None = None,
    task: str | None = None,
    tag: str | None = None,
    status: str | None = None,
    search: str | None = None,
    started_after: datetime | None = None,
    started_before: datetime | None = None,
    limit: int = 200,
    window: int = RECENT_WINDOW,
    project_scope: int | None = None,
) -> list[RunSummary]:
    """Runs, newest first, filtered by project/task name, tag, status, a case-insensitive
    substring of name/uid/task (``search``) and start time; each with its current B_simple."""
    stmt = _run_select().order_by(Run.started_at.desc(), Run.id.desc())
    if project is not None:
        stmt = stmt.where(Project.name == project)
    if task is not None:
        stmt = stmt.where(Task.name == task)
    if status is not None:
        stmt = stmt.where(Run.status == status)
    if started_after is not None:
        stmt = stmt.where(Run.started_at >= started_after)
    if started_before is not None:
        stmt = stmt.where(Run.started_at < started_before)
    if project_scope is not None:
        stmt = stmt.where(Run.project_id == project_scope)
    if search:
        # a literal substring: LIKE wildcards and the escape character are escaped, and both
        # sides are lowered by the database (SQLite's lower() leaves non-ASCII as is, so a
        # Python-lowered pattern would never match a name like "Ωμέγα")
        escaped = search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        pattern = func.lower(f"%{escaped}%")
        stmt = stmt.where(
            or_(
                func.lower(Run.name).like(pattern, escape="\\"),
                func.lower(Run.uid).like(pattern, escape="\\"),
                func.lower(Task.name).like(pattern, escape="\\"),
            )
        )
    with engine.connect() as conn:
        rows = conn.execute(stmt).all()
        if tag is not None:  # JSON containment is not portable; tags lists are short
            rows = [r for r in rows if tag in (r.tags or [])]
        return [_summarise(conn, r, window) for r in rows[: max(limit, 0)]]


def _scoped_run(conn: Connection, run_uid: str, project_scope: int | None) -> Any:
    row = conn.execute(_run_select().where(Run.uid == run_uid)).first()
    if row is None:
        raise NotFound(f"run {run_uid!r} does not exist")
    if project_scope is not None and int(row.project_id) != project_scope:
        raise Forbidden(f"this token does not grant access to the project of run {run_uid!r}")
    return row


def get_run(
    engine: Engine, run_uid: str, *, window: int = RECENT_WINDOW, project_scope: int | None = None
) -> RunSummary:
    """One run's summary; raises ``crud.NotFound`` for an unknown uid."""
    with engine.connect() as conn:
        return _summarise(conn, _scoped_run(conn, run_uid, project_scope), window)


def list_projects(engine: Engine, *, project_scope: int | None = None) -> list[str]:
    stmt = select(Project.name).order_by(Project.name)
    if project_scope is not None:
        stmt = stmt.where(Project.id == project_scope)
    with engine.connect() as conn:
        return [str(r[0]) for r in conn.execute(stmt)]


# --- several runs at once (the dashboard's charts and comparisons) -------------------------


@dataclass(frozen=True)
class BucketSums:
    """One bucket of one (run, series): raw sums, so that smoothing stays the reader's choice.

    Buckets split each (run, series) step range evenly. ``step`` and ``examples`` are the
    bucket's last, ``time`` its last sample's seconds since the series' first, ``loss`` and
    ``lr`` means over the samples that had one, ``batch_size`` the largest B_big (the batch in
    use).
    """

    run_uid: str
    series: str
    bucket: int
    n: int
    sum_g_sq: float
    sum_trace_sigma: float
    step: int
    examples: float | None
    time: float | None
    loss: float | None
    lr: float | None
    batch_size: float | None


#: A run is read from the server's ``sample_block`` sums (``BLOCK_SIZE`` samples each; a
#: 1M-sample run is ~16k rows, not 1M) once it has at least this many blocks per requested
#: point, otherwise from ``sample`` itself, so short runs keep per-step resolution.
BLOCKS_PER_POINT = 1.0


def _sample_rows() -> Any:
    """Per-sample rows in the same shape as ``_block_rows`` (a sample is a block of one)."""
    s = Sample
    return select(
        s.run_id,
        s.series,
        s.step.label("step_lo"),
        s.step.label("step_hi"),
        literal(1, BigInteger).label("n"),
        s.g_sq_est.label("sum_g_sq"),
        s.trace_sigma_est.label("sum_trace_sigma"),
        case((s.loss.is_(None), 0), else_=1).label("n_loss"),
        s.loss.label("sum_loss"),
        case((s.lr.is_(None), 0), else_=1).label("n_lr"),
        s.lr.label("sum_lr"),
        s.examples.label("examples_max"),
        s.time.label("time_min"),
        s.time.label("time_max"),
        s.b_big.label("b_big_max"),
    )


def _block_rows() -> Any:
    b = SampleBlock
    return select(
        b.run_id,
        b.series,
        b.step_min.label("step_lo"),
        b.step_max.label("step_hi"),
        b.n,
        b.sum_g_sq,
        b.sum_trace_sigma,
        b.n_loss,
        b.sum_loss,
        b.n_lr,
        b.sum_lr,
        b.examples_max,
        b.time_min,
        b.time_max,
        b.b_big_max,
    )


def _sizes(conn: Connection, run_ids: Sequence[int]) -> dict[int, int]:
    """Whole-model sample count per run, from the block table (cheap at any run length)."""
    q = (
        select(SampleBlock.run_id, func.sum(SampleBlock.n))
        .where(SampleBlock.series == "", SampleBlock.run_id.in_(list(run_ids)))
        .group_by(SampleBlock.run_id)
    )
    return {int(r): int(n or 0) for r, n in conn.execute(q)}


def _bucket_source(
    conn: Connection, run_ids: Sequence[int], series: Sequence[str], min_blocks: float
) -> Any:
    """Sample rows for short runs and block rows for long ones, as one subquery.

    A run counts as long once it has ``min_blocks`` blocks: buckets of whole blocks are then
    still at least as fine as the caller asked for.
    """
    sizes = _sizes(conn, run_ids)
    threshold = BLOCK_SIZE * min_blocks
    small = [r for r in run_ids if sizes.get(r, 0) < threshold]
    big = [r for r in run_ids if sizes.get(r, 0) >= threshold]
    parts: list[Any] = []
    if small:
        parts.append(_sample_rows().where(Sample.run_id.in_(small), Sample.series.in_(series)))
    if big:
        parts.append(
            _block_rows().where(SampleBlock.run_id.in_(big), SampleBlock.series.in_(series))
        )
    if not parts:
        parts.append(_sample_rows().where(false()))
    combined: Any = parts[0] if len(parts) == 1 else union_all(parts[0], parts[1])
    return combined.subquery("rows")


def bucket_sums(
    engine: Engine,
    run_uids: Sequence[str],
    *,
    series: Sequence[str] = ("",),
    max_points: int = 2000,
    min_blocks: float | None = None,
    project_scope: int | None = None,
) -> list[BucketSums]:
    """Bucketed sums for several runs and series in one query, at most ``max_points`` each.

    Runs with at least ``min_blocks`` pre-summed blocks (default: one per requested point) are
    read from ``sample_block``; comparisons of many runs accept coarser buckets for speed.
    Unknown runs, and runs outside ``project_scope``, are left out.
    """
    if not run_uids:
        return []
    max_points = max(1, int(max_points))
    with engine.connect() as conn:
        known = select(Run.id).where(Run.uid.in_(list(run_uids)))
        if project_scope is not None:
            known = known.where(Run.project_id == project_scope)
        run_ids = [int(i) for i in conn.execute(known).scalars()]
        rows = _bucket_source(
            conn,
            run_ids,
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
        # PostgreSQL, which made max_points + 1 uneven buckets there
        bucket = (
            (rows.c.step_lo - stats.c.mn) * max_points // (stats.c.mx - stats.c.mn + 1)
        ).label("bucket")
        q = (
            select(
                Run.uid.label("run"),
                rows.c.series,
                bucket,
                func.sum(rows.c.n).label("n"),
                func.sum(rows.c.sum_g_sq).label("sum_g_sq"),
                func.sum(rows.c.sum_trace_sigma).label("sum_trace_sigma"),
                func.max(rows.c.step_hi).label("step"),
                func.max(rows.c.examples_max).label("examples"),
                (func.max(rows.c.time_max) - func.min(stats.c.t0)).label("time"),
                (func.sum(rows.c.sum_loss) / func.nullif(func.sum(rows.c.n_loss), 0)).label("loss"),
                (func.sum(rows.c.sum_lr) / func.nullif(func.sum(rows.c.n_lr), 0)).label("lr"),
                func.max(rows.c.b_big_max).label("batch_size"),
            )
            .join(
                stats,
                and_(stats.c.run_id == rows.c.run_id, stats.c.series == rows.c.series),
            )
            .join(Run, Run.id == rows.c.run_id)
            .group_by(Run.uid, rows.c.series, bucket)
            .order_by(Run.uid, rows.c.series, bucket)
        )
        return [_bucket_sums(row) for row in conn.execute(q)]


def _opt(value: Any) -> float | None:
    return None if value is None else float(value)


def _bucket_sums(row: Any) -> BucketSums:
    """Plain Python numbers: PostgreSQL returns sums of integers as Decimal."""
    uid, series, bucket, n, g_sq, trace_sigma, step, examples, time, loss, lr, batch = row
    return BucketSums(
        str(uid),
        str(series),
        int(bucket),
        int(n),
        float(g_sq),
        float(trace_sigma),
        int(step),
        _opt(examples),
        _opt(time),
        _opt(loss),
        _opt(lr),
        _opt(batch),
    )


# --- series ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SeriesPoint:
    """One bucket: exact sums over its samples, and the estimates derived from them.

    ``x`` is the bucket's mean x over its samples' range (``x_lo``..``x_hi``); ``g_sq`` and
    ``trace_sigma`` are the bucket means of the per-sample estimates; ``b_simple`` is their
    ratio (None, with ``reason``, where not measurable) and ``b_simple_lo/hi`` its ``LEVEL``
    interval from the bucket's sub-buckets (None when too few to tell).
    """

    x: float
    x_lo: float
    x_hi: float
    step_lo: int
    step_hi: int
    examples_hi: float | None
    n: int
    sum_g_sq: float
    sum_trace_sigma: float
    g_sq: float
    trace_sigma: float
    b_simple: float | None
    b_simple_lo: float | None
    b_simple_hi: float | None
    reason: str | None
    loss: float | None
    lr: float | None


@dataclass(frozen=True)
class RunSeries:
    run_uid: str
    series: str
    x: XAxis
    units: str
    n_samples: int
    #: "samples" (bucketed from raw rows) or "blocks" (from pre-summed 64-sample blocks).
    source: str
    points: list[SeriesPoint]


def _x_columns(x: XAxis, use_blocks: bool) -> tuple[Any, Any]:
    if use_blocks:
        lo = {"step": SampleBlock.step_min, "examples": SampleBlock.examples_min}.get(
            x, SampleBlock.time_min
        )
        hi = {"step": SampleBlock.step_max, "examples": SampleBlock.examples_max}.get(
            x, SampleBlock.time_max
        )
        return lo, hi
    col = {"step": Sample.step, "examples": Sample.examples}.get(x, Sample.time)
    return col, col


def _bucket_rows(
    conn: Connection,
    run_id: int,
    series: str,
    x: XAxis,
    n_fine: int,
    use_blocks: bool,
    x_min: Any,
    x_max: Any,
) -> list[Any]:
    if x_min is None:
        return []
    x_lo_col, x_hi_col = _x_columns(x, use_blocks)
    table: Any = SampleBlock if use_blocks else Sample
    where = and_(table.run_id == run_id, table.series == series, x_lo_col.is_not(None))
    span = float(x_max) - float(x_min)
    scale = (n_fine / (span * (1.0 + 1e-9))) if span > 0 else 0.0
    raw_index = (cast(x_lo_col, Float) - literal(float(x_min))) * literal(scale)
    # floor() of a non-negative number: SQLite's CAST truncates, PostgreSQL's rounds.
    index_expr: Any = (
        func.floor(raw_index) if conn.dialect.name == "postgresql" else cast(raw_index, Integer)
    )
    index = index_expr.label("fine")
    if use_blocks:
        aggregates = [
            func.sum(SampleBlock.n),
            func.sum(SampleBlock.sum_g_sq),
            func.sum(SampleBlock.sum_trace_sigma),
            func.sum(SampleBlock.n_loss),
            func.sum(SampleBlock.sum_loss),
            func.sum(SampleBlock.n_lr),
            func.sum(SampleBlock.sum_lr),
            func.min(x_lo_col),
            func.max(x_hi_col),
            func.min(SampleBlock.step_min),
            func.max(SampleBlock.step_max),
            func.max(SampleBlock.examples_max),
        ]
    else:
        aggregates = [
            func.count(),
            func.sum(Sample.g_sq_est),
            func.sum(Sample.trace_sigma_est),
            func.count(Sample.loss),
            func.sum(Sample.loss),
            func.count(Sample.lr),
            func.sum(Sample.lr),
            func.min(x_lo_col),
            func.max(x_hi_col),
            func.min(Sample.step),
            func.max(Sample.step),
            func.max(Sample.examples),
        ]
    stmt = select(index, *aggregates).where(where).group_by(index).order_by(index)
    # Plain DBAPI tuples: up to 4 x max_points rows, no per-value result processing needed.
    cursor = conn.execute(stmt).cursor
    assert cursor is not None
    return list(cursor.fetchall())


def run_series(
    engine: Engine,
    run_uid: str,
    *,
    x: XAxis = "step",
    max_points: int = 2000,
    series: str = "",
    intervals: bool = True,
    project_scope: int | None = None,
) -> RunSeries:
    """A run's series bucketed in SQL to at most ``max_points`` buckets along ``x``.

    Buckets are equal-width in ``x``; empty buckets are omitted. Samples without a value for
    ``x`` (e.g. no ``examples`` logged) are left out. ``intervals=False`` skips the per-bucket
    interval (``b_simple_lo/hi`` None), which is most of the Python time on 2000 buckets.
    Raises ``crud.NotFound``.
    """
    if x not in X_AXES:
        raise ValueError(f"x must be one of {', '.join(X_AXES)}, got {x!r}")
    max_points = max(1, int(max_points))
    with engine.connect() as conn:
        run = _scoped_run(conn, run_uid, project_scope)
        run_id = int(run.id)
        # Count and x range in one pass over the blocks (their min/max are the samples').
        block_lo, block_hi = _x_columns(x, True)
        n_total, x_min, x_max = conn.execute(
            select(func.sum(SampleBlock.n), func.min(block_lo), func.max(block_hi)).where(
                SampleBlock.run_id == run_id, SampleBlock.series == series
            )
        ).one()
        n_samples = int(n_total or 0)
        # Blocks once there are at least max_points/2 of them: scanning raw samples costs more
        # than the resolution gained (points then hold >= 64 samples each).
        use_blocks = n_samples >= BLOCK_SIZE * max_points // 2
        # Sub-buckets only where a bucket can hold enough samples for its own interval.
        sub = _SUB if intervals and n_samples >= MIN_INTERVAL_SAMPLES * max_points else 1
        rows = _bucket_rows(conn, run_id, series, x, max_points * sub, use_blocks, x_min, x_max)
    points = _merge_fine(rows, intervals, sub)
    return RunSeries(
        run_uid, series, x, str(run.units), n_samples, "blocks" if use_blocks else "samples", points
    )


def _merge_fine(rows: Sequence[Any], intervals: bool = True, sub: int = _SUB) -> list[SeriesPoint]:
    """Sum sub-buckets into buckets; each bucket's sub-buckets are its jackknife blocks.

    ``rows`` are (fine index, n, sum_g, sum_s, n_loss, sum_loss, n_lr, sum_lr, x_lo, x_hi,
    step_lo, step_hi, examples_hi) ordered by fine index.
    """
    points: list[SeriesPoint] = []
    i = 0
    total = len(rows)
    while i < total:
        key = int(rows[i][0]) // sub
        j = i + 1
        while j < total and int(rows[j][0]) // sub == key:
            j += 1
        (_, c_n, c_g, c_s, c_nl, c_sl, c_nr, c_sr, c_xlo, c_xhi, c_slo, c_shi, c_ex) = zip(
            *rows[i:j], strict=True
        )
        i = j
        block_n = list(map(int, c_n))
        n = sum(block_n)
        if n <= 0:
            continue
        block_g = list(map(float, c_g))
        block_s = list(map(float, c_s))
        n_loss = sum(int(v or 0) for v in c_nl)
        n_lr = sum(int(v or 0) for v in c_nr)
        ex = [float(v) for v in c_ex if v is not None]
        points.append(
            _point(
                block_n if intervals else [n],
                block_g,
                block_s,
                n=n,
                sum_g=sum(block_g),
                sum_s=sum(block_s),
                x_lo=float(min(c_xlo)),
                x_hi=float(max(c_xhi)),
                step_lo=int(min(c_slo)),
                step_hi=int(max(c_shi)),
                examples_hi=max(ex) if ex else None,
                loss=sum(float(v or 0.0) for v in c_sl) / n_loss if n_loss else None,
                lr=sum(float(v or 0.0) for v in c_sr) / n_lr if n_lr else None,
            )
        )
    return points


def _point(
    block_n: Sequence[float],
    block_g: Sequence[float],
    block_s: Sequence[float],
    *,
    n: int,
    sum_g: float,
    sum_s: float,
    x_lo: float,
    x_hi: float,
    step_lo: int,
    step_hi: int,
    examples_hi: float | None,
    loss: float | None,
    lr: float | None,
) -> SeriesPoint:
    point = NoiseScale.from_sums(sum_g, sum_s, n)
    lo = hi = None
    reason = point.reason
    if point.b_simple is not None and len(block_n) >= 2 and n >= MIN_INTERVAL_SAMPLES:
        iv = interval_from_blocks(block_n, block_g, block_s, level=LEVEL)
        if iv.b_simple is not None:
            lo, hi = iv.b_simple.lo, iv.b_simple.hi
    return SeriesPoint(
        x=(x_lo + x_hi) / 2.0,
        x_lo=x_lo,
        x_hi=x_hi,
        step_lo=step_lo,
        step_hi=step_hi,
        examples_hi=examples_hi,
        n=n,
        sum_g_sq=sum_g,
        sum_trace_sigma=sum_s,
        g_sq=sum_g / n,
        trace_sigma=sum_s / n,
        b_simple=point.b_simple,
        b_simple_lo=lo,
        b_simple_hi=hi,
        reason=reason,
        loss=loss,
        lr=lr,
    )


def smooth_series(points: Sequence[SeriesPoint], window: int) -> list[SeriesPoint]:
    """Trailing-window smoothing over buckets: each output point sums the last ``window``
    buckets (ratio of sums, science.md) and takes its interval from those buckets as blocks.

    ``window=1`` returns the points unchanged. Used by the dashboard's smoothing control, so the
    smoothed curve and its band come from the same exact sums as the raw buckets.
    """
    if window <= 1:
        return list(points)
    out = []
    for i in range(len(points)):
        chunk = points[max(0, i - window + 1) : i + 1]
        losses = [(p.loss, p.n) for p in chunk if p.loss is not None]
        lrs = [(p.lr, p.n) for p in chunk if p.lr is not None]
        loss_w = sum(w for _, w in losses)
        lr_w = sum(w for _, w in lrs)
        out.append(
            _point(
                [p.n for p in chunk],
                [p.sum_g_sq for p in chunk],
                [p.sum_trace_sigma for p in chunk],
                n=sum(p.n for p in chunk),
                sum_g=sum(p.sum_g_sq for p in chunk),
                sum_s=sum(p.sum_trace_sigma for p in chunk),
                x_lo=chunk[0].x_lo,
                x_hi=chunk[-1].x_hi,
                step_lo=chunk[0].step_lo,
                step_hi=chunk[-1].step_hi,
                examples_hi=chunk[-1].examples_hi,
                loss=sum(v * w for v, w in losses) / loss_w if loss_w else None,
                lr=sum(v * w for v, w in lrs) / lr_w if lr_w else None,
            )
        )
    return out


@dataclass(frozen=True)
class SeriesInfo:
    name: str
    n_samples: int


def series_names(
    engine: Engine, run_uid: str, *, project_scope: int | None = None
) -> list[SeriesInfo]:
    """The series of a run ("" is the whole model), with their sample counts."""
    with engine.connect() as conn:
        run = _scoped_run(conn, run_uid, project_scope)
        rows = conn.execute(
            select(SampleBlock.series, func.sum(SampleBlock.n))
            .where(SampleBlock.run_id == run.id)
            .group_by(SampleBlock.series)
            .order_by(SampleBlock.series)
        ).all()
    return [SeriesInfo(str(r[0]), int(r[1])) for r in rows]


@dataclass(frozen=True)
class EventRow:
    step: int
    kind: str
    payload: dict[str, Any]
    time: float | None
    seq: int | None


def run_events(engine: Engine, run_uid: str, *, project_scope: int | None = None) -> list[EventRow]:
    """A run's events (batch-size changes, marks) in step order."""
    with engine.connect() as conn:
        run = _scoped_run(conn, run_uid, project_scope)
        rows = conn.execute(
            select(Event.step, Event.kind, Event.payload, Event.time, Event.seq)
            .where(Event.run_id == run.id)
            .order_by(Event.step, Event.id)
        ).all()
    return [
        EventRow(int(r[0]), str(r[1]), dict(r[2] or {}), r[3], None if r[4] is None else int(r[4]))
        for r in rows
    ]


# --- tasks and the critical batch ------------------------------------------------------------


@dataclass(frozen=True)
class TaskSummary:
    """A task across its runs; ``b_simple_median`` is the median of the runs' current B_simple."""

    project: str
    task: str
    n_runs: int
    n_running: int
    n_samples: int
    batch_sizes: list[float]
    units: list[str]
    last_started_at: datetime | None
    b_simple_median: float | None


def task_summaries(
    engine: Engine, project: str | None = None, *, project_scope: int | None = None
) -> list[TaskSummary]:
    """One row per (project, task), for cross-task comparison."""
    runs = list_runs(engine, project=project, limit=1_000_000, project_scope=project_scope)
    groups: dict[tuple[str, str], list[RunSummary]] = {}
    for r in runs:
        groups.setdefault((r.project, r.task), []).append(r)
    out = []
    for (proj, task), members in sorted(groups.items()):
        b_values = [r.b_simple for r in members if r.b_simple is not None]
        starts = [r.started_at for r in members if r.started_at is not None]
        out.append(
            TaskSummary(
                project=proj,
                task=task,
                n_runs=len(members),
                n_running=sum(r.status == "running" for r in members),
                n_samples=sum(r.n_samples for r in members),
                batch_sizes=sorted({r.batch_size for r in members if r.batch_size is not None}),
                units=sorted({r.units for r in members}),
                last_started_at=max(starts) if starts else None,
                b_simple_median=statistics.median(b_values) if b_values else None,
            )
        )
    return out


@dataclass(frozen=True)
class Crossing:
    """Where a run's bucketed loss first reached ``target`` (None fields: never reached)."""

    target: float
    step: int | None
    examples: float | None
    #: B_simple over the buckets around the crossing: the noise scale at that loss.
    b_simple: float | None


@dataclass(frozen=True)
class RunCrossings:
    uid: str
    name: str
    batch_size: float | None
    units: str
    crossings: list[Crossing]


def loss_target_crossings(
    engine: Engine,
    task: str,
    targets: Sequence[float],
    *,
    project: str | None = None,
    max_points: int = 500,
    smooth: int = 3,
    project_scope: int | None = None,
) -> list[RunCrossings]:
    """Per run of ``task``: the first step/examples where the loss reached each target.

    The loss is the per-bucket mean of a ``max_points`` bucketing along steps, smoothed over
    ``smooth`` trailing buckets, so a single noisy minibatch does not count as reaching it.
    Input for ``noisescope.estimators.fit_critical_batch`` (science.md, Sec. 2.2-3).
    """
    runs = list_runs(
        engine, project=project, task=task, limit=1_000_000, window=0, project_scope=project_scope
    )
    out = []
    for r in runs:
        series = run_series(engine, r.uid, x="step", max_points=max_points)
        points = smooth_series(series.points, smooth)
        crossings = []
        for target in targets:
            hit = next((p for p in points if p.loss is not None and p.loss <= target), None)
            crossings.append(
                Crossing(
                    float(target),
                    None if hit is None else hit.step_hi,
                    None if hit is None else hit.examples_hi,
                    None if hit is None else hit.b_simple,
                )
            )
        out.append(RunCrossings(r.uid, r.name, r.batch_size, r.units, crossings))
    return out


# --- export ----------------------------------------------------------------------------------

CSV_COLUMNS = SAMPLE_COLUMNS


def raw_samples_csv(
    engine: Engine,
    run_uid: str,
    *,
    series: str | None = None,
    chunk_rows: int = 5000,
    project_scope: int | None = None,
) -> Iterator[str]:
    """Stream a run's raw samples as CSV text chunks (header first), in ``seq`` order.

    The run is checked before the first chunk is produced (so HTTP can still answer 404), then
    rows are read in ``chunk_rows`` pages by seq, keeping memory flat for any run length.
    """
    with engine.connect() as conn:
        run_id = int(_scoped_run(conn, run_uid, project_scope).id)
    return _csv_chunks(engine, run_id, series, chunk_rows)


def _csv_chunks(engine: Engine, run_id: int, series: str | None, chunk_rows: int) -> Iterator[str]:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    yield buf.getvalue()
    cols = [getattr(Sample, c) for c in CSV_COLUMNS]
    after = -1
    while True:
        stmt = select(*cols).where(Sample.run_id == run_id, Sample.seq > after)
        if series is not None:
            stmt = stmt.where(Sample.series == series)
        with engine.connect() as conn:
            rows = conn.execute(stmt.order_by(Sample.seq).limit(chunk_rows)).all()
        if not rows:
            return
        buf.seek(0)
        buf.truncate()
        writer.writerows(_csv_row(r) for r in rows)
        yield buf.getvalue()
        after = int(rows[-1][0])


def _csv_row(row: Sequence[Any]) -> list[Any]:
    return [
        "" if v is None else (repr(v) if isinstance(v, float) and math.isfinite(v) else v)
        for v in row
    ]
