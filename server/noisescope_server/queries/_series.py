"""One run's series: bucketed in SQL along step, examples or time, and handed to the
estimators: each bucket's B_simple and interval from its sub-buckets
(``estimators.bucket_noise_scales``), trailing-window smoothing (``estimators.trailing_windows``).
What is left here is fetching, summing sub-buckets into buckets, and building the points."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Any, Literal

from sqlalchemy import (
    Connection,
    Engine,
    Float,
    Integer,
    and_,
    cast,
    func,
    literal,
    literal_column,
    select,
)

from noisescope.estimators import (
    BUCKET_BLOCKS,
    bucket_blocks,
    bucket_noise_scales,
    trailing_windows,
)
from noisescope.protocol import RunSeries, SeriesInfo, SeriesPoint
from noisescope_server.errors import BadInput
from noisescope_server.models import BLOCK_SIZE, Sample, SampleBlock, Series
from noisescope_server.queries._common import LEVEL, fetch_tuples, scoped_run
from noisescope_server.queries._decoded import fine_columns
from noisescope_server.queries._samples import ESTIMATE_SQL, series_number, summed_in_sql

XAxis = Literal["step", "examples", "time"]
X_AXES: tuple[XAxis, ...] = ("step", "examples", "time")


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


def _fine_columns(
    conn: Connection,
    run_id: int,
    series_id: int,
    x: XAxis,
    n_fine: int,
    use_blocks: bool,
    x_min: Any,
    x_max: Any,
) -> list[Sequence[Any]]:
    """The fine buckets' sums in SQL (of blocks, or of the samples of a run SQL can sum:
    ``_samples.summed_in_sql``), as columns in fine-index order: (fine index, n, sum_g,
    sum_s, n_loss, sum_loss, n_lr, sum_lr, x_lo, x_hi, step_lo, step_hi, examples_hi,
    b_big_max); no columns when the run has no samples along ``x``.

    Along steps the x range is the step range, read once: every column the GROUP BY carries
    costs its sort."""
    if x_min is None:
        return []
    x_lo_col, x_hi_col = _x_columns(x, use_blocks)
    table: Any = SampleBlock if use_blocks else Sample
    where = and_(table.run_id == run_id, table.series_id == series_id, x_lo_col.is_not(None))
    span = float(x_max) - float(x_min)
    scale = (n_fine / (span * (1.0 + 1e-9))) if span > 0 else 0.0
    raw_index = (cast(x_lo_col, Float) - literal(float(x_min))) * literal(scale)
    # floor() of a non-negative number: SQLite's CAST truncates, PostgreSQL's rounds.
    index_expr: Any = (
        func.floor(raw_index) if conn.dialect.name == "postgresql" else cast(raw_index, Integer)
    )
    index = index_expr.label("fine")
    step_lo, step_hi = _x_columns("step", use_blocks)
    if use_blocks:
        sums = [
            func.sum(SampleBlock.n),
            func.sum(SampleBlock.sum_g_sq),
            func.sum(SampleBlock.sum_trace_sigma),
            func.sum(SampleBlock.n_loss),
            func.sum(SampleBlock.sum_loss),
            func.sum(SampleBlock.n_lr),
            func.sum(SampleBlock.sum_lr),
        ]
        tail = [func.max(SampleBlock.examples_max), func.max(SampleBlock.b_big_max)]
    else:
        sums = [
            func.count(),
            func.sum(ESTIMATE_SQL["g_sq_est"]),
            func.sum(ESTIMATE_SQL["trace_sigma_est"]),
            func.count(Sample.loss),
            func.sum(Sample.loss),
            func.count(Sample.lr),
            func.sum(Sample.lr),
        ]
        tail = [func.max(Sample.examples), func.max(Sample.b_big)]
    extent = [func.min(x_lo_col), func.max(x_hi_col)]
    if x != "step":
        extent += [func.min(step_lo), func.max(step_hi)]
    # Grouped by the label: two copies of the expression (with their own bound parameters)
    # look different to SQLite, which then sorts a second time for the ORDER BY.
    label: Any = literal_column(index.name)
    stmt = select(index, *sums, *extent, *tail).where(where).group_by(label).order_by(label)
    # Plain DBAPI tuples: up to 4 x max_points rows, no per-value result processing needed.
    columns: list[Sequence[Any]] = list(zip(*fetch_tuples(conn, stmt), strict=True))
    if columns and x == "step":
        columns[10:10] = columns[8:10]
    return columns


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
    buckets; each bucket is read as ``estimators.bucket_blocks`` sub-buckets, the blocks of its
    interval. Raises ``errors.NotFound``.
    """
    if x not in X_AXES:
        raise BadInput(f"x must be one of {', '.join(X_AXES)}, got {x!r}")
    max_points = max(1, int(max_points))
    with engine.connect() as conn:
        run = scoped_run(conn, run_uid, project_scope)
        run_id = int(run.id)
        series_id = series_number(conn, run_id, series)
        # Count and x range in one pass over the blocks (their min/max are the samples').
        block_lo, block_hi = _x_columns(x, True)
        n_total, x_min, x_max = conn.execute(
            select(func.sum(SampleBlock.n), func.min(block_lo), func.max(block_hi)).where(
                SampleBlock.run_id == run_id, SampleBlock.series_id == series_id
            )
        ).one()
        n_samples = int(n_total or 0)
        # Blocks once there are at least max_points/2 of them: scanning raw samples costs more
        # than the resolution gained (points then hold >= 64 samples each).
        use_blocks = n_samples >= BLOCK_SIZE * max_points // 2
        sub = bucket_blocks(n_samples, max_points) if intervals else 1
        if use_blocks or summed_in_sql(conn, [run_id]):
            fine = _fine_columns(
                conn, run_id, series_id, x, max_points * sub, use_blocks, x_min, x_max
            )
        else:  # sample by sample in Python, their estimates derived where read (``_samples``)
            fine = fine_columns(conn, run_id, series, x, max_points * sub, x_min, x_max)
    if window > 0:  # a window's interval comes from its buckets, not from theirs
        points = smooth_series(_merge_fine(fine, False, sub), window, intervals=intervals)
    else:
        points = _merge_fine(fine, intervals, sub)
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


def _merge_fine(
    fine: Sequence[Sequence[Any]], intervals: bool = True, sub: int = BUCKET_BLOCKS
) -> list[SeriesPoint]:
    """Sum sub-buckets into buckets; each bucket's sub-buckets are its jackknife blocks.

    ``fine`` are ``_fine_columns``. The work is done a column at a time, not a bucket at a
    time (PostgreSQL returns integer sums as Decimal, hence the conversions).
    """
    if not fine:
        return []
    (c_index, c_n, c_g, c_s, c_nl, c_sl, c_nr, c_sr, c_xlo, c_xhi, c_slo, c_shi, c_ex, c_b) = fine
    block_n = list(map(int, c_n))
    block_g = list(map(float, c_g))
    block_s = list(map(float, c_s))
    n_loss = [int(v or 0) for v in c_nl]
    sum_loss = [float(v or 0.0) for v in c_sl]
    n_lr = [int(v or 0) for v in c_nr]
    sum_lr = [float(v or 0.0) for v in c_sr]
    blocks: list[tuple[list[int], list[float], list[float]]] | None = None
    if sub == 1:
        # Every fine bucket is a bucket (they are GROUP BY groups), and a sum of one value v
        # is 0 + v: the same numbers as summing one-element slices, without the slices.
        n, g, s = block_n, [0 + v for v in block_g], [0 + v for v in block_s]
        loss_n, loss, lr_n, lr = n_loss, [0 + v for v in sum_loss], n_lr, [0 + v for v in sum_lr]
        x_lo, x_hi = list(map(float, c_xlo)), list(map(float, c_xhi))
        step_lo, step_hi = list(map(int, c_slo)), list(map(int, c_shi))
        examples = [None if v is None else float(v) for v in c_ex]
        batch = list(map(float, c_b))
    else:
        keys = [int(k) // sub for k in c_index]
        starts = [i for i in range(1, len(keys)) if keys[i] != keys[i - 1]]
        cuts = [slice(i, j) for i, j in pairwise([0, *starts, len(keys)])]

        def per_bucket(reduce: Any, column: Sequence[Any]) -> list[Any]:
            return list(map(reduce, map(column.__getitem__, cuts)))

        n, g, s = per_bucket(sum, block_n), per_bucket(sum, block_g), per_bucket(sum, block_s)
        loss_n, loss = per_bucket(sum, n_loss), per_bucket(sum, sum_loss)
        lr_n, lr = per_bucket(sum, n_lr), per_bucket(sum, sum_lr)
        step_lo, step_hi = per_bucket(min, c_slo), per_bucket(max, c_shi)
        if c_xlo is c_slo and c_xhi is c_shi:  # along steps
            x_lo, x_hi = list(map(float, step_lo)), list(map(float, step_hi))
        else:
            x_lo = list(map(float, per_bucket(min, c_xlo)))
            x_hi = list(map(float, per_bucket(max, c_xhi)))
        step_lo, step_hi = list(map(int, step_lo)), list(map(int, step_hi))
        examples = per_bucket(_max_known, c_ex)
        batch = per_bucket(max, list(map(float, c_b)))
        if intervals:
            blocks = [(block_n[c], block_g[c], block_s[c]) for c in cuts]
    return series_points(
        blocks,
        n=n,
        sum_g=g,
        sum_s=s,
        x_lo=x_lo,
        x_hi=x_hi,
        step_lo=step_lo,
        step_hi=step_hi,
        examples_hi=examples,
        loss=[t / w if w else None for t, w in zip(loss, loss_n, strict=True)],
        lr=[t / w if w else None for t, w in zip(lr, lr_n, strict=True)],
        batch_size=batch,
    )


def _max_known(values: Sequence[Any]) -> float | None:
    """The largest of the values that are not None, as a float (None if none is)."""
    if None not in values:
        return max(map(float, values))
    known = [float(v) for v in values if v is not None]
    return max(known) if known else None


def series_points(
    blocks: Sequence[tuple[Sequence[float], Sequence[float], Sequence[float]]] | None,
    *,
    n: Sequence[int],
    sum_g: Sequence[float],
    sum_s: Sequence[float],
    x_lo: Sequence[float],
    x_hi: Sequence[float],
    step_lo: Sequence[int],
    step_hi: Sequence[int],
    examples_hi: Sequence[float | None],
    loss: Sequence[float | None],
    lr: Sequence[float | None],
    batch_size: Sequence[float | None],
) -> list[SeriesPoint]:
    """Buckets' points from their sums, one column per field and one value per bucket;
    empty buckets are left out. Each bucket's B_simple and interval (over its ``blocks``; none
    without) are ``estimators.bucket_noise_scales``'.

    Column by column: the answers hold thousands of buckets, and per-bucket calls were most
    of a series read's time."""
    noise = bucket_noise_scales(n, sum_g, sum_s, blocks, level=LEVEL)
    return [
        SeriesPoint(
            x=(a + b) / 2.0,
            x_lo=a,
            x_hi=b,
            step_lo=first,
            step_hi=last,
            examples_hi=ex,
            n=count,
            sum_g_sq=g,
            sum_trace_sigma=s,
            g_sq=g_mean,
            trace_sigma=s_mean,
            b_simple=b_simple,
            b_simple_lo=low,
            b_simple_hi=high,
            reason=reason,
            loss=mean_loss,
            lr=mean_lr,
            batch_size=batch,
        )
        for (
            a,
            b,
            first,
            last,
            ex,
            count,
            g,
            s,
            g_mean,
            s_mean,
            b_simple,
            reason,
            low,
            high,
            mean_loss,
            mean_lr,
            batch,
        ) in zip(
            x_lo,
            x_hi,
            step_lo,
            step_hi,
            examples_hi,
            n,
            sum_g,
            sum_s,
            noise.g_sq,
            noise.trace_sigma,
            noise.b_simple,
            noise.reason,
            noise.lo,
            noise.hi,
            loss,
            lr,
            batch_size,
            strict=True,
        )
        if count > 0
    ]


def smooth_series(
    points: Sequence[SeriesPoint], window: float, *, intervals: bool = True
) -> list[SeriesPoint]:
    """``points`` smoothed by trailing windows of ``window`` steps (``estimators.trailing_windows``:
    exact sums, ratio last, each window's interval from its buckets). A window narrower than a
    bucket is that bucket.

    The dashboard's smoothing control goes through here, so a smoothed curve and its band come
    from the same exact sums as the raw buckets. It never changes a run's current B_simple.
    """
    if window <= 0:
        return list(points)
    windows = trailing_windows(
        [p.step_hi for p in points],
        window,
        n=[p.n for p in points],
        sum_g_sq=[p.sum_g_sq for p in points],
        sum_trace_sigma=[p.sum_trace_sigma for p in points],
        loss=[p.loss for p in points],
        lr=[p.lr for p in points],
        blocks=intervals,
    )
    firsts = windows.first
    return series_points(
        windows.blocks,
        n=windows.n,
        sum_g=windows.sum_g_sq,
        sum_s=windows.sum_trace_sigma,
        x_lo=[points[lo].x_lo for lo in firsts],
        x_hi=[p.x_hi for p in points],
        step_lo=[points[lo].step_lo for lo in firsts],
        step_hi=[p.step_hi for p in points],
        examples_hi=[p.examples_hi for p in points],
        loss=windows.loss,
        lr=windows.lr,
        batch_size=[p.batch_size for p in points],
    )


def series_names(
    engine: Engine, run_uid: str, *, project_scope: int | None = None
) -> list[SeriesInfo]:
    """The series of a run ("" is the whole model), with their sample counts."""
    with engine.connect() as conn:
        run = scoped_run(conn, run_uid, project_scope)
        rows = conn.execute(
            select(Series.name, func.sum(SampleBlock.n))
            .join(
                Series,
                and_(Series.run_id == SampleBlock.run_id, Series.id == SampleBlock.series_id),
            )
            .where(SampleBlock.run_id == run.id)
            .group_by(Series.name)
            .order_by(Series.name)
        ).all()
    return [SeriesInfo(str(r[0]), int(r[1])) for r in rows]
