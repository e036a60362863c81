"""The read side: the one place the HTTP query API reads stored runs from.

Every function takes an ``Engine`` and returns plain frozen dataclasses (``noisescope._results``,
the same classes ``noisescope.Api`` decodes), so the server, the dashboard and a notebook hold
the very same fields. Aggregation happens in SQL: a series is bucketed to at most
``max_points`` buckets of *exact* sums of the per-sample unbiased estimates |𝒢|^2 and 𝒮
(docs/science.md, two-batch estimator); B_simple = sum 𝒮 / sum |𝒢|^2 and its interval (block
jackknife + Fieller) are computed afterwards by ``noisescope.estimators``. Long runs are read
from ``sample_block`` (pre-summed blocks of 64 consecutive samples maintained at ingest), short
ones from ``sample`` directly.

``project_scope`` (a project id) restricts every function to one project; the HTTP layer sets
it from the caller's token. A run outside the scope raises ``errors.Forbidden``.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
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

from noisescope import _wire
from noisescope._results import (
    EventRow,
    RunSeries,
    RunSummary,
    SeriesInfo,
    SeriesPoint,
    TaskSummary,
)
from noisescope.estimators import (
    NoiseScale,
    current_noise_scale,
    interval_from_blocks,
)
from noisescope.schedule import EVENT_KIND as BATCH_SIZE_EVENT
from noisescope_server.errors import BadInput, Forbidden, NotFound
from noisescope_server.jsonclip import clip_json
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
from noisescope_server.utc import as_utc, utcnow

__all__ = [
    "BucketSums",
    "EventRow",
    "RunSeries",
    "RunSummary",
    "SeriesInfo",
    "SeriesPoint",
    "TaskSummary",
    "XAxis",
    "bucket_sums",
    "compare_series",
    "finite_number",
    "get_run",
    "list_projects",
    "list_runs",
    "raw_samples_csv",
    "run_events",
    "run_series",
    "run_status",
    "series_names",
    "smooth_series",
    "task_summaries",
]

XAxis = Literal["step", "examples", "time"]
X_AXES: tuple[XAxis, ...] = ("step", "examples", "time")
#: Confidence level of every interval the query layer returns.
LEVEL = 0.9
#: A current window of up to this many samples is read as raw samples, a longer one as
#: 64-sample blocks (then at least 64 of them: the interval's 30 blocks are as fine either way).
CURRENT_RAW_LIMIT = 64 * BLOCK_SIZE
#: ``b_simple_reason`` of runs listed with ``current=False``.
NOT_COMPUTED = "not computed: the run was listed without its current B_simple (current=false)"
#: Smallest bucket that gets its own interval: a handful of samples cut into sub-blocks says
#: nothing useful, and skipping them keeps short runs' 2000-point series cheap.
MIN_INTERVAL_SAMPLES = 32
#: Sub-buckets per bucket: the blocks a bucket's own jackknife interval is computed from.
_SUB = 4


# --- runs ------------------------------------------------------------------------------------


def run_status(crash_after: float = _wire.CRASH_AFTER) -> Any:
    """A run's status as readers see it: a stored "running" whose process has not been heard
    from (any write or heartbeat sets ``last_seen_at``) for ``crash_after`` seconds reads
    "crashed". Computed at read time, so a run that sends again reads "running" again and
    workers hold no state."""
    cutoff = utcnow() - timedelta(seconds=crash_after)
    seen = func.coalesce(Run.last_seen_at, Run.started_at)
    return case((and_(Run.status == "running", seen < cutoff), "crashed"), else_=Run.status)


def _run_select(crash_after: float = _wire.CRASH_AFTER) -> Any:
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
            run_status(crash_after).label("status"),
            Run.started_at,
            Run.ended_at,
            Run.last_seen_at,
            Run.project_id,
        )
        .join(Project, Project.id == Run.project_id)
        .join(Task, Task.id == Run.task_id)
    )


@dataclass(frozen=True)
class _Current:
    """A run's current window (``estimators.current_window``) and where it lies."""

    b_simple: float | None
    lo: float | None
    hi: float | None
    reason: str | None
    g_sq: float | None
    trace_sigma: float | None
    n: int
    first_step: int | None
    last_step: int | None


def _current(conn: Connection, run_id: int, n_samples: int) -> _Current:
    """The current B_simple of a run (``estimators.current_noise_scale``): windows of up to
    ``CURRENT_RAW_LIMIT`` samples are read as raw samples, longer ones as 64-sample blocks,
    so either way the interval has its full count of blocks and the read stays small. Rows
    come as plain DBAPI tuples: a window is up to thousands of them per run, on every list."""
    rows: list[Any] = []

    def trailing(target: int) -> tuple[list[float], list[float], list[float]]:
        nonlocal rows
        rows = (
            _trailing_samples(conn, run_id, min(target, n_samples))
            if target <= CURRENT_RAW_LIMIT
            else _trailing_blocks(conn, run_id, target)
        )
        return [float(r[0]) for r in rows], [float(r[1]) for r in rows], [float(r[2]) for r in rows]

    used, interval = current_noise_scale(float(n_samples), trailing, level=LEVEL)
    b_iv, g_iv, s_iv = interval.b_simple, interval.g_sq, interval.trace_sigma
    return _Current(
        b_simple=None if b_iv is None else b_iv.value,
        lo=None if b_iv is None else b_iv.lo,
        hi=None if b_iv is None else b_iv.hi,
        reason=interval.reason if b_iv is None else None,
        g_sq=None if g_iv is None else g_iv.value,
        trace_sigma=None if s_iv is None else s_iv.value,
        n=int(used),
        first_step=int(min(r[3] for r in rows)) if rows and used else None,
        last_step=int(max(r[4] for r in rows)) if rows and used else None,
    )


def _trailing_samples(conn: Connection, run_id: int, count: int) -> list[Any]:
    """The last ``count`` whole-model samples, oldest first, as one-sample blocks.

    (Summing them into the interval's blocks in SQL, with a window function, measured slower
    on SQLite than reading the rows: a fetch of 1,000 rows is about a millisecond.)"""
    stmt = (
        select(Sample.g_sq_est, Sample.trace_sigma_est, Sample.step)
        .where(Sample.run_id == run_id, Sample.series == "")
        .order_by(Sample.seq.desc())
        .limit(count)
    )
    return [(1, g, t, step, step) for g, t, step in reversed(_tuples(conn, stmt))]


def _trailing_blocks(conn: Connection, run_id: int, target: int) -> list[Any]:
    """The run's last 64-sample blocks that hold at least ``target`` samples, oldest first."""
    stmt = (
        select(
            SampleBlock.n,
            SampleBlock.sum_g_sq,
            SampleBlock.sum_trace_sigma,
            SampleBlock.step_min,
            SampleBlock.step_max,
        )
        .where(SampleBlock.run_id == run_id, SampleBlock.series == "")
        .order_by(SampleBlock.block.desc())
    )
    fetched, count = [], 0
    for block in _tuples(conn, stmt):  # newest first, until the window's count is reached
        if count >= target:
            break
        fetched.append(block)
        count += int(block[0])
    return fetched[::-1]


def _tuples(conn: Connection, stmt: Any) -> list[Any]:
    """A statement's rows as plain DBAPI tuples (no per-row result objects)."""
    cursor = conn.execute(stmt).cursor
    assert cursor is not None
    return list(cursor.fetchall())


#: Run ids per ``IN (...)`` of the set-based run queries (SQLite bounds bound parameters).
_ID_CHUNK = 900


@dataclass(frozen=True)
class _RunFacts:
    """What the run list reads for all its runs at once (a handful of queries, not per run)."""

    n_samples: dict[int, int]
    last: dict[int, tuple[int, float | None]]
    events: dict[tuple[int, str], dict[str, Any]]


def _run_facts(conn: Connection, run_ids: Sequence[int]) -> _RunFacts:
    """Sample counts, last step and examples (from the block table) and the latest event of
    each kind that means something (eval, batch_size, notice), for many runs at once."""
    n_samples: dict[int, int] = {}
    last: dict[int, tuple[int, float | None]] = {}
    events: dict[tuple[int, str], dict[str, Any]] = {}
    kinds = [_wire.EVAL_EVENT_KIND, BATCH_SIZE_EVENT, _wire.NOTICE_EVENT_KIND]
    for lo in range(0, len(run_ids), _ID_CHUNK):
        ids = list(run_ids[lo : lo + _ID_CHUNK])
        counts = select(SampleBlock.run_id, func.sum(SampleBlock.n)).where(
            SampleBlock.run_id.in_(ids), SampleBlock.series == ""
        )
        for run_id, n in _tuples(conn, counts.group_by(SampleBlock.run_id)):
            n_samples[int(run_id)] = int(n or 0)
        # steps and examples only grow with seq: the largest over all series is the last
        ends = select(
            SampleBlock.run_id, func.max(SampleBlock.step_max), func.max(SampleBlock.examples_max)
        ).where(SampleBlock.run_id.in_(ids))
        for run_id, step, examples in _tuples(conn, ends.group_by(SampleBlock.run_id)):
            last[int(run_id)] = (int(step), None if examples is None else float(examples))
        rank = (
            func.row_number()
            .over(
                partition_by=(Event.run_id, Event.kind),
                order_by=(Event.step.desc(), Event.id.desc()),
            )
            .label("rank")
        )
        ranked = (
            select(Event.run_id, Event.kind, Event.payload, rank)
            .where(Event.run_id.in_(ids), Event.kind.in_(kinds))
            .subquery()
        )
        latest = select(ranked.c.run_id, ranked.c.kind, ranked.c.payload).where(ranked.c.rank == 1)
        for run_id, kind, payload in conn.execute(latest):
            if isinstance(payload, dict):
                events[(int(run_id), str(kind))] = dict(payload)
    return _RunFacts(n_samples, last, events)


def finite_number(value: Any) -> float | None:
    """A finite number from a JSON payload or config (booleans, text and NaN are not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _positive(value: Any) -> float | None:
    number = finite_number(value)
    return number if number is not None and number > 0 else None


def _summarise(conn: Connection, row: Any, facts: _RunFacts, *, current: bool = True) -> RunSummary:
    run_id = int(row.id)
    n_samples = facts.n_samples.get(run_id, 0)
    last = facts.last.get(run_id)
    last_loss = conn.execute(
        select(Sample.loss)
        .where(Sample.run_id == run_id, Sample.loss.is_not(None))
        .order_by(Sample.seq.desc())
        .limit(1)
    ).scalar()
    evaluation = facts.events.get((run_id, _wire.EVAL_EVENT_KIND))
    change = facts.events.get((run_id, BATCH_SIZE_EVENT))
    notice = facts.events.get((run_id, _wire.NOTICE_EVENT_KIND))
    in_use = _positive(change.get("batch_size")) if change else None
    source = "event" if in_use is not None else None
    if in_use is None and _positive(row.batch_size) is not None:
        in_use, source = float(row.batch_size), "run"
    now = (
        _current(conn, run_id, n_samples)
        if current
        else _Current(None, None, None, NOT_COMPUTED, None, None, 0, None, None)
    )
    if n_samples == 0 and current:
        reason = "no samples yet"
        if notice and isinstance(notice.get("message"), str):
            reason += f": {notice['message']}"
        now = _Current(None, None, None, reason, None, None, 0, None, None)
    return RunSummary(
        uid=str(row.uid),
        project=str(row.project),
        task=str(row.task),
        name=str(row.name),
        tags=clip_json(row.tags) if isinstance(row.tags, list) else [],
        config=clip_json(row.config) if isinstance(row.config, dict) else {},
        batch_size=row.batch_size,
        units=str(row.units),
        status=str(row.status),
        started_at=as_utc(row.started_at),
        ended_at=as_utc(row.ended_at),
        last_seen_at=as_utc(row.last_seen_at),
        n_samples=n_samples,
        last_step=None if last is None else last[0],
        last_examples=None if last is None else last[1],
        last_loss=None if last_loss is None else float(last_loss),
        last_eval_loss=finite_number(evaluation.get("loss")) if evaluation else None,
        batch_in_use=in_use,
        batch_in_use_source=source,
        level=LEVEL,
        b_simple=now.b_simple,
        b_simple_lo=now.lo,
        b_simple_hi=now.hi,
        b_simple_reason=now.reason,
        g_sq=now.g_sq,
        trace_sigma=now.trace_sigma,
        window_samples=now.n,
        window_first_step=now.first_step,
        window_last_step=now.last_step,
        batch_to_b_simple=(in_use / now.b_simple if in_use is not None and now.b_simple else None),
        notice=str(notice["message"])
        if notice and isinstance(notice.get("message"), str)
        else None,
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
    project_scope: int | None = None,
    current: bool = True,
    crash_after: float = _wire.CRASH_AFTER,
) -> list[RunSummary]:
    """Runs, newest first, filtered by project/task name, tag, status (as ``run_status``
    reads it), a case-insensitive substring of name/uid/task (``search``) and start time; each
    with its current B_simple (``current=False`` skips that window, for callers that only need
    the runs)."""
    stmt = _run_select(crash_after).order_by(Run.started_at.desc(), Run.id.desc())
    if project is not None:
        stmt = stmt.where(Project.name == project)
    if task is not None:
        stmt = stmt.where(Task.name == task)
    if status is not None:
        stmt = stmt.where(run_status(crash_after) == status)
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
        rows = rows[: max(limit, 0)]
        facts = _run_facts(conn, [int(r.id) for r in rows])
        return [_summarise(conn, r, facts, current=current) for r in rows]


def _scoped_run(
    conn: Connection,
    run_uid: str,
    project_scope: int | None,
    crash_after: float = _wire.CRASH_AFTER,
) -> Any:
    row = conn.execute(_run_select(crash_after).where(Run.uid == run_uid)).first()
    if row is None:
        raise NotFound(f"run {run_uid!r} does not exist")
    if project_scope is not None and int(row.project_id) != project_scope:
        raise Forbidden(f"this token does not grant access to the project of run {run_uid!r}")
    return row


def get_run(
    engine: Engine,
    run_uid: str,
    *,
    project_scope: int | None = None,
    crash_after: float = _wire.CRASH_AFTER,
) -> RunSummary:
    """One run's summary; raises ``errors.NotFound`` for an unknown uid."""
    with engine.connect() as conn:
        row = _scoped_run(conn, run_uid, project_scope, crash_after)
        return _summarise(conn, row, _run_facts(conn, [int(row.id)]))


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
                func.min(rows.c.step_lo).label("step_lo"),
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
    uid, series, bucket, n, g_sq, trace_sigma, step_lo, step, examples, time, loss, lr, batch = row
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
    )


# --- series ----------------------------------------------------------------------------------


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
            func.max(SampleBlock.b_big_max),
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
            func.max(Sample.b_big),
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
    window: float = 0.0,
    intervals: bool = True,
    project_scope: int | None = None,
) -> RunSeries:
    """A run's series bucketed in SQL to at most ``max_points`` buckets along ``x``.

    Buckets are equal-width in ``x``; empty buckets are omitted. Samples without a value for
    ``x`` (e.g. no ``examples`` logged) are left out. ``window`` > 0 smooths the series by
    trailing windows of that many steps (``smooth_series``). ``intervals=False`` skips the
    per-bucket interval (``b_simple_lo/hi`` None), which is most of the Python time on 2000
    buckets. Raises ``errors.NotFound``.
    """
    if x not in X_AXES:
        raise BadInput(f"x must be one of {', '.join(X_AXES)}, got {x!r}")
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
    if window > 0:
        points = smooth_series(points, window, intervals=intervals)
    return RunSeries(
        run_uid,
        series,
        x,
        str(run.units),
        n_samples,
        "blocks" if use_blocks else "samples",
        float(window),
        points,
    )


def _merge_fine(rows: Sequence[Any], intervals: bool = True, sub: int = _SUB) -> list[SeriesPoint]:
    """Sum sub-buckets into buckets; each bucket's sub-buckets are its jackknife blocks.

    ``rows`` are (fine index, n, sum_g, sum_s, n_loss, sum_loss, n_lr, sum_lr, x_lo, x_hi,
    step_lo, step_hi, examples_hi, b_big_max) ordered by fine index.
    """
    points: list[SeriesPoint] = []
    i = 0
    total = len(rows)
    while i < total:
        key = int(rows[i][0]) // sub
        j = i + 1
        while j < total and int(rows[j][0]) // sub == key:
            j += 1
        (_, c_n, c_g, c_s, c_nl, c_sl, c_nr, c_sr, c_xlo, c_xhi, c_slo, c_shi, c_ex, c_b) = zip(
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
                batch_size=max(float(v) for v in c_b),
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
    batch_size: float | None,
    interval: bool = True,
) -> SeriesPoint:
    point = NoiseScale.from_sums(sum_g, sum_s, n)
    lo = hi = None
    reason = point.reason
    if interval and point.b_simple is not None and len(block_n) >= 2 and n >= MIN_INTERVAL_SAMPLES:
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
        batch_size=batch_size,
    )


def smooth_series(
    points: Sequence[SeriesPoint], window: float, *, intervals: bool = True
) -> list[SeriesPoint]:
    """Trailing-window smoothing: each point sums the buckets whose steps end within the last
    ``window`` steps before its own last step (ratio of sums, docs/science.md) and takes its
    interval from those buckets as blocks. A window narrower than a bucket is that bucket.

    The dashboard's smoothing control goes through here, so a smoothed curve and its band come
    from the same exact sums as the raw buckets. It never changes a run's current B_simple.
    Running sums keep it linear in the number of points whatever the window.
    """
    if window <= 0:
        return list(points)
    sums = _prefix_sums(points)
    out = []
    start = 0
    for i, point in enumerate(points):
        while start < i and points[start].step_hi <= point.step_hi - window:
            start += 1

        def total(k: int, lo: int = start, hi: int = i + 1) -> float:
            return sums[hi][k] - sums[lo][k]

        chunk = points[start : i + 1] if intervals else ()
        n, loss_w, lr_w = int(total(0)), total(3), total(5)
        out.append(
            _point(
                [p.n for p in chunk],
                [p.sum_g_sq for p in chunk],
                [p.sum_trace_sigma for p in chunk],
                n=n,
                sum_g=total(1),
                sum_s=total(2),
                x_lo=points[start].x_lo,
                x_hi=point.x_hi,
                step_lo=points[start].step_lo,
                step_hi=point.step_hi,
                examples_hi=point.examples_hi,
                loss=total(4) / loss_w if loss_w else None,
                lr=total(6) / lr_w if lr_w else None,
                batch_size=point.batch_size,
                interval=intervals,
            )
        )
    return out


def _prefix_sums(points: Sequence[SeriesPoint]) -> list[tuple[float, ...]]:
    """Running (n, sum_g, sum_s, n with loss, sum n*loss, n with lr, sum n*lr) over points."""
    acc: list[tuple[float, ...]] = [(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)]
    for p in points:
        n_loss = p.n if p.loss is not None else 0
        n_lr = p.n if p.lr is not None else 0
        a = acc[-1]
        acc.append(
            (
                a[0] + p.n,
                a[1] + p.sum_g_sq,
                a[2] + p.sum_trace_sigma,
                a[3] + n_loss,
                a[4] + n_loss * (p.loss or 0.0),
                a[5] + n_lr,
                a[6] + n_lr * (p.lr or 0.0),
            )
        )
    return acc


def _bucket_point(b: BucketSums) -> SeriesPoint:
    """A several-runs bucket as a series point along steps (one block, no interval)."""
    return _point(
        [b.n],
        [b.sum_g_sq],
        [b.sum_trace_sigma],
        n=b.n,
        sum_g=b.sum_g_sq,
        sum_s=b.sum_trace_sigma,
        x_lo=float(b.step_lo),
        x_hi=float(b.step),
        step_lo=b.step_lo,
        step_hi=b.step,
        examples_hi=b.examples,
        loss=b.loss,
        lr=b.lr,
        batch_size=b.batch_size,
        interval=False,
    )


#: A compared run with this many 64-sample blocks is read from the block table (coarser,
#: much faster: 100 runs of 10,000 samples is 16k rows instead of 1M).
COMPARE_MIN_BLOCKS = 100


def compare_series(
    engine: Engine,
    run_uids: Sequence[str],
    *,
    max_points: int = 400,
    window_fraction: float = 0.1,
    project_scope: int | None = None,
) -> list[RunSeries]:
    """Whole-model series of several runs along steps, in one query, each smoothed over the
    trailing ``window_fraction`` of its own step range (runs of different lengths alike).

    Points carry no interval (the comparison charts draw none). Unknown runs, and runs outside
    ``project_scope``, are left out.
    """
    buckets = bucket_sums(
        engine,
        run_uids,
        max_points=max_points,
        min_blocks=COMPARE_MIN_BLOCKS,
        project_scope=project_scope,
    )
    by_run: dict[str, list[SeriesPoint]] = {}
    for b in buckets:
        by_run.setdefault(b.run_uid, []).append(_bucket_point(b))
    with engine.connect() as conn:
        units = dict(
            conn.execute(select(Run.uid, Run.units).where(Run.uid.in_(list(by_run)))).all()
        )
    out = []
    for uid in run_uids:
        points = by_run.get(uid)
        if points is None:
            continue
        span = points[-1].step_hi - points[0].step_lo + 1
        window = max(1.0, window_fraction * span) if window_fraction > 0 else 0.0
        smoothed = smooth_series(points, window, intervals=False) if window > 0 else points
        n = sum(p.n for p in points)
        source = "blocks" if n >= BLOCK_SIZE * COMPARE_MIN_BLOCKS else "samples"
        out.append(
            RunSeries(
                uid,
                "",
                "step",
                str(units.get(uid, "examples")),
                n,
                source,
                window,
                smoothed,
            )
        )
    return out


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
        EventRow(
            int(r[0]),
            str(r[1]),
            clip_json(r[2]) if isinstance(r[2], dict) else {},
            r[3],
            None if r[4] is None else int(r[4]),
        )
        for r in rows
    ]


# --- tasks and the critical batch ------------------------------------------------------------


def task_summaries(
    engine: Engine,
    project: str | None = None,
    *,
    project_scope: int | None = None,
    crash_after: float = _wire.CRASH_AFTER,
) -> list[TaskSummary]:
    """One row per (project, task), for cross-task comparison."""
    runs = list_runs(
        engine,
        project=project,
        limit=1_000_000,
        project_scope=project_scope,
        crash_after=crash_after,
    )
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
                n_measured=len(b_values),
                b_simple_median=statistics.median(b_values) if b_values else None,
                b_simple_min=min(b_values) if b_values else None,
                b_simple_max=max(b_values) if b_values else None,
            )
        )
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
