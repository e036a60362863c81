"""Several runs' whole-model series along steps, for the comparison charts."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Engine, select

from noisescope.estimators import run_fraction_window
from noisescope.protocol import RunSeries, SeriesPoint
from noisescope_server.models import Run
from noisescope_server.queries._buckets import BucketSums, bucket_sums
from noisescope_server.queries._series import series_points, smooth_series


def _bucket_points(buckets: Sequence[BucketSums]) -> list[SeriesPoint]:
    """One run's several-runs buckets as series points along steps (no intervals)."""
    return series_points(
        None,
        n=[b.n for b in buckets],
        sum_g=[b.sum_g_sq for b in buckets],
        sum_s=[b.sum_trace_sigma for b in buckets],
        x_lo=[float(b.step_lo) for b in buckets],
        x_hi=[float(b.step) for b in buckets],
        step_lo=[b.step_lo for b in buckets],
        step_hi=[b.step for b in buckets],
        examples_hi=[b.examples for b in buckets],
        loss=[b.loss for b in buckets],
        lr=[b.lr for b in buckets],
        batch_size=[b.batch_size for b in buckets],
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
    archived: str = "exclude",
) -> list[RunSeries]:
    """Whole-model series of several runs along steps, in one query, each smoothed over the
    trailing ``window_fraction`` of its own step range (``estimators.run_fraction_window``:
    runs of different lengths alike).

    Points carry no interval (the comparison charts draw none). Unknown runs, runs outside
    ``project_scope`` and archived runs (unless ``archived`` says otherwise) are left out.
    """
    buckets = bucket_sums(
        engine,
        run_uids,
        max_points=max_points,
        min_blocks=COMPARE_MIN_BLOCKS,
        project_scope=project_scope,
        archived=archived,
    )
    by_uid: dict[str, list[BucketSums]] = {}
    for b in buckets:
        by_uid.setdefault(b.run_uid, []).append(b)
    by_run = {uid: _bucket_points(run_buckets) for uid, run_buckets in by_uid.items()}
    with engine.connect() as conn:
        units = dict(
            conn.execute(select(Run.uid, Run.units).where(Run.uid.in_(list(by_run)))).all()
        )
    out = []
    for uid in run_uids:
        points = by_run.get(uid)
        if points is None:
            continue
        window = run_fraction_window(points[0].step_lo, points[-1].step_hi, window_fraction)
        smoothed = smooth_series(points, window, intervals=False) if window > 0 else points
        n = sum(p.n for p in points)
        source = "blocks" if by_uid[uid][0].from_blocks else "samples"
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
