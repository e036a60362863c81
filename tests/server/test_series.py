"""One run's series on both backends, against the plain per-bucket reading of the same rows.

The series code works a column at a time (thousands of buckets per answer); each point must
still be exactly what the estimators' own rules give for its bucket, taken one bucket at a
time: ``NoiseScale.from_sums`` for B_simple, ``interval_from_blocks`` over the bucket's
sub-buckets (or, smoothed, over the window's buckets) for its interval. Compared as the JSON
the API sends, byte for byte, on a run with gaps (loss, lr, examples), a resumed stretch whose
steps repeat, a stretch without measurable signal and a second series, from raw samples and
from blocks, along steps, examples and time.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import orjson
import pytest
from sqlalchemy import Engine, func, select

from harness import columns
from noisescope._results import SeriesPoint
from noisescope.estimators import NoiseScale, interval_from_blocks
from noisescope_server import crud, db, queries
from noisescope_server.models import Run, SampleBlock
from noisescope_server.queries import _series
from noisescope_server.queries._common import LEVEL
from noisescope_server.queries._samples import series_number


def _ingest(engine: Engine, cols: dict[str, list[Any]]) -> None:
    crud.ingest_samples(engine, "r", crud.validate_samples({"columns": cols}))


@pytest.fixture
def engine(db_url: str) -> Engine:
    engine = db.make_engine(db_url)
    db.upgrade(engine)
    crud.upsert_run(engine, "r", crud.RunIn(project="p", task="t", batch_size=32))
    first = columns(4000, seed=1)
    for i in range(0, 4000, 3):
        first["loss"][i] = None
    first["lr"][1000:2000] = [None] * 1000
    # noise alone (E|G_B|^2 = tr(Sigma)/B): the |G|^2 estimates scatter around 0
    for i in range(2500, 3200):
        first["g_small_sq"][i] = 5.0 * (1.0 + (i % 7) / 10.0)
        first["g_big_sq"][i] = 1.25 * (1.0 + (i % 5) / 10.0)
    _ingest(engine, first)
    resumed = columns(2000, start=4000, seed=2)  # steps 2000..3999 again, no examples logged
    resumed["step"] = [s - 2000 for s in resumed["step"]]
    del resumed["examples"]
    _ingest(engine, resumed)
    _ingest(engine, columns(1500, start=6000, seed=3, series="layer.0"))
    return engine


def _fine(engine: Engine, series: str, x: Any, n_fine: int, use_blocks: bool) -> Any:
    with engine.connect() as conn:
        run_id = conn.execute(select(Run.id).where(Run.uid == "r")).scalar_one()
        block_lo, block_hi = _series._x_columns(x, True)
        number = series_number(conn, run_id, series)
        x_min, x_max = conn.execute(
            select(func.min(block_lo), func.max(block_hi)).where(
                SampleBlock.run_id == run_id, SampleBlock.series_id == number
            )
        ).one()
        return _series._fine_columns(conn, run_id, number, x, n_fine, use_blocks, x_min, x_max)


def _point(
    blocks: tuple[list[int], list[float], list[float]] | None,
    *,
    n: int,
    sum_g: float,
    sum_s: float,
    x_lo: float,
    x_hi: float,
    **rest: Any,
) -> SeriesPoint:
    """A bucket's point the plain way: its NoiseScale, then its interval over ``blocks``."""
    point = NoiseScale.from_sums(sum_g, sum_s, n)
    lo = hi = None
    if blocks and point.b_simple is not None and len(blocks[0]) >= 2 and n >= 32:
        iv = interval_from_blocks(*blocks, level=LEVEL).b_simple
        if iv is not None:
            lo, hi = iv.lo, iv.hi
    return SeriesPoint(
        x=(x_lo + x_hi) / 2.0,
        x_lo=x_lo,
        x_hi=x_hi,
        n=n,
        sum_g_sq=sum_g,
        sum_trace_sigma=sum_s,
        g_sq=sum_g / n,
        trace_sigma=sum_s / n,
        b_simple=point.b_simple,
        b_simple_lo=lo,
        b_simple_hi=hi,
        reason=point.reason,
        **rest,
    )


def _reference_points(rows: Sequence[Any], intervals: bool, sub: int) -> list[SeriesPoint]:
    points = []
    for _, group in itertools.groupby(rows, key=lambda r: int(r[0]) // sub):
        (_, c_n, c_g, c_s, c_nl, c_sl, c_nr, c_sr, c_xlo, c_xhi, c_slo, c_shi, c_ex, c_b) = zip(
            *group, strict=True
        )
        block_n = [int(v) for v in c_n]
        block_g = [float(v) for v in c_g]
        block_s = [float(v) for v in c_s]
        n, n_loss, n_lr = sum(block_n), sum(int(v or 0) for v in c_nl), sum(int(v) for v in c_nr)
        examples = [float(v) for v in c_ex if v is not None]
        points.append(
            _point(
                (block_n, block_g, block_s) if intervals else None,
                n=n,
                sum_g=sum(block_g),
                sum_s=sum(block_s),
                x_lo=float(min(c_xlo)),
                x_hi=float(max(c_xhi)),
                step_lo=int(min(c_slo)),
                step_hi=int(max(c_shi)),
                examples_hi=max(examples) if examples else None,
                loss=sum(float(v or 0.0) for v in c_sl) / n_loss if n_loss else None,
                lr=sum(float(v or 0.0) for v in c_sr) / n_lr if n_lr else None,
                batch_size=max(float(v) for v in c_b),
            )
        )
    return points


def _reference_smooth(
    points: Sequence[SeriesPoint], window: float, intervals: bool
) -> list[SeriesPoint]:
    """Each window's sums as running-sum differences, its interval over its buckets."""
    acc: list[tuple[float, ...]] = [(0.0,) * 7]
    for p in points:
        w_loss = p.n if p.loss is not None else 0
        w_lr = p.n if p.lr is not None else 0
        a = acc[-1]
        terms = (p.n, p.sum_g_sq, p.sum_trace_sigma, w_loss, w_loss * (p.loss or 0.0))
        acc.append(
            tuple(x + y for x, y in zip(a, (*terms, w_lr, w_lr * (p.lr or 0.0)), strict=True))
        )
    out, start = [], 0
    for i, p in enumerate(points):
        while start < i and points[start].step_hi <= p.step_hi - window:
            start += 1
        total = [hi - lo for lo, hi in zip(acc[start], acc[i + 1], strict=True)]
        chunk = points[start : i + 1]
        out.append(
            _point(
                (
                    [c.n for c in chunk],
                    [c.sum_g_sq for c in chunk],
                    [c.sum_trace_sigma for c in chunk],
                )
                if intervals
                else None,
                n=int(total[0]),
                sum_g=total[1],
                sum_s=total[2],
                x_lo=points[start].x_lo,
                x_hi=p.x_hi,
                step_lo=points[start].step_lo,
                step_hi=p.step_hi,
                examples_hi=p.examples_hi,
                loss=total[4] / total[3] if total[3] else None,
                lr=total[6] / total[5] if total[5] else None,
                batch_size=p.batch_size,
            )
        )
    return out


@pytest.mark.parametrize("x", ["step", "examples", "time"])
def test_every_point_is_its_bucket_read_on_its_own(engine: Engine, x: Any) -> None:
    checked = 0
    for series, use_blocks, n_fine, sub, intervals in itertools.product(
        ["", "layer.0"], [False, True], [7, 60, 400], [1, 4], [True, False]
    ):
        fine = _fine(engine, series, x, n_fine * sub, use_blocks)
        points = _series._merge_fine(fine, intervals, sub)
        expected = _reference_points(list(zip(*fine, strict=True)), intervals, sub)
        assert orjson.dumps(points) == orjson.dumps(expected), (series, use_blocks, n_fine, sub)
        for window in (3.0, 250.0, 1e9):
            smoothed = queries.smooth_series(points, window, intervals=intervals)
            assert orjson.dumps(smoothed) == orjson.dumps(
                _reference_smooth(points, window, intervals)
            ), (series, use_blocks, n_fine, sub, window)
        checked += len(points)
    assert checked > 1000


def test_the_checked_run_has_intervals_unmeasurable_buckets_and_gaps(engine: Engine) -> None:
    """The run above exercises what it should: bounded intervals, buckets without a B_simple
    or without an interval, buckets without loss or lr, and points without examples."""
    points = queries.run_series(engine, "r", max_points=40).points
    assert any(p.b_simple_lo is not None for p in points)
    assert any(p.b_simple is not None and p.b_simple_lo is None for p in points)
    assert any(p.lr is None for p in points)
    # along time the noise-only stretch is not mixed with the resumed steps
    assert any(p.b_simple is None for p in queries.run_series(engine, "r", x="time").points)
    along = queries.run_series(engine, "r", x="examples", max_points=40)
    assert along.n_samples == 6000 > sum(p.n for p in along.points)  # the resumed part
    assert all(math.isfinite(p.g_sq) for p in points)


def test_compared_series_are_their_buckets_read_on_their_own(engine: Engine) -> None:
    (compared,) = queries.compare_series(engine, ["r"], max_points=50, window_fraction=0.2)
    buckets = queries.bucket_sums(engine, ["r"], max_points=50, min_blocks=100)
    points = [
        _point(
            None,
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
        )
        for b in buckets
    ]
    expected = _reference_smooth(points, compared.window_steps, intervals=False)
    assert orjson.dumps(compared.points) == orjson.dumps(expected)
    # 6,000 whole-model samples, under COMPARE_MIN_BLOCKS (100) blocks of 64: read from the
    # samples, as the label says
    assert (compared.n_samples, compared.source) == (6000, "samples")
