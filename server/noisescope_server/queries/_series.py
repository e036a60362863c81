"""One run's series: bucketed in SQL along step, examples or time, each bucket's interval
from its sub-buckets, and trailing-window smoothing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from sqlalchemy import Connection, Engine, Float, Integer, and_, cast, func, literal, select

from noisescope._results import RunSeries, SeriesInfo, SeriesPoint
from noisescope.estimators import NoiseScale, interval_from_blocks
from noisescope_server.errors import BadInput
from noisescope_server.models import BLOCK_SIZE, Sample, SampleBlock
from noisescope_server.queries._common import LEVEL, fetch_tuples, scoped_run

XAxis = Literal["step", "examples", "time"]
X_AXES: tuple[XAxis, ...] = ("step", "examples", "time")
#: Smallest bucket that gets its own interval: a handful of samples cut into sub-blocks says
#: nothing useful, and skipping them keeps short runs' 2000-point series cheap.
MIN_INTERVAL_SAMPLES = 32
#: Sub-buckets per bucket: the blocks a bucket's own jackknife interval is computed from.
_SUB = 4


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
    return fetch_tuples(conn, stmt)


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
        run = scoped_run(conn, run_uid, project_scope)
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
            series_point(
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


def series_point(
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
    """A bucket's point from its sums; its interval from ``block_*`` taken as jackknife blocks."""
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
            series_point(
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


def series_names(
    engine: Engine, run_uid: str, *, project_scope: int | None = None
) -> list[SeriesInfo]:
    """The series of a run ("" is the whole model), with their sample counts."""
    with engine.connect() as conn:
        run = scoped_run(conn, run_uid, project_scope)
        rows = conn.execute(
            select(SampleBlock.series, func.sum(SampleBlock.n))
            .where(SampleBlock.run_id == run.id)
            .group_by(SampleBlock.series)
            .order_by(SampleBlock.series)
        ).all()
    return [SeriesInfo(str(r[0]), int(r[1])) for r in rows]
