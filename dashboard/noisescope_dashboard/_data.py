"""The dashboard's reads: every query aggregates in SQL and returns small frames.

Runs, series names, events and raw CSV come from the server's read module
(``noisescope_server.queries``). ``runs_series`` is the dashboard's own: several runs and
series in one query, with the batch in use (max B_big) and wall time per bucket, as raw sums
so that smoothing stays the reader's choice; it belongs in ``queries`` eventually.

Each series comes back as at most ``max_points`` buckets holding *exact sums* of the
per-sample linear estimates (|𝒢|^2 and 𝒮, stored at ingest by ``noisescope.estimators``), so
the ratio, smoothing and interval are taken afterwards in ``_model`` and no sample is ever
loaded into pandas. Reads are cached per database URL with a short ttl (live runs keep moving).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import pandas as pd
import sqlalchemy as sa
import streamlit as st

from noisescope_server import queries
from noisescope_server.models import BLOCK_SIZE, Run, Sample, SampleBlock

from ._charts import MAX_POINTS

__all__ = [
    "DATABASE_URL_ENV",
    "TTL_S",
    "database_url",
    "get_engine",
    "list_runs",
    "raw_samples_csv",
    "run_events",
    "runs_series",
    "series_names",
]

DATABASE_URL_ENV = "NOISESCOPE_DATABASE_URL"
#: Cache lifetime of database reads: short, since live runs keep adding samples.
TTL_S = 5.0


def database_url() -> str | None:
    """The database the dashboard reads, from NOISESCOPE_DATABASE_URL (set by ``noisescope up``)."""
    url = os.environ.get(DATABASE_URL_ENV, "").strip()
    return url or None


@st.cache_resource(show_spinner=False)
def get_engine(url: str) -> sa.Engine:
    """One pooled engine per URL for the whole Streamlit process (shared, never copied)."""
    try:
        from noisescope_server import db as server_db

        make = getattr(server_db, "make_engine", None) or getattr(server_db, "create_engine", None)
        if make is not None:
            engine: sa.Engine = make(url)
            return engine
    except ImportError:
        pass
    if url.startswith("sqlite"):
        engine = sa.create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})
    else:
        engine = sa.create_engine(url, pool_pre_ping=True)
    return engine


def _frame(result: sa.CursorResult[Any]) -> pd.DataFrame:
    return pd.DataFrame(result.fetchall(), columns=list(result.keys()))


#: A run is read from the server's ``sample_block`` sums (``BLOCK_SIZE`` samples each; a
#: 1M-sample run is ~16k rows, not 1M) once it has at least this many blocks per requested
#: point, otherwise from ``sample`` itself, so short runs keep per-step resolution.
BLOCKS_PER_POINT = 1.0


def _sample_rows() -> Any:
    """Per-sample rows in the same shape as ``_block_rows`` (a sample is a block of one)."""
    s = Sample
    return sa.select(
        s.run_id,
        s.series,
        s.step.label("step_lo"),
        s.step.label("step_hi"),
        sa.literal(1, sa.BigInteger).label("n"),
        s.g_sq_est.label("sum_g_sq"),
        s.trace_sigma_est.label("sum_trace_sigma"),
        sa.case((s.loss.is_(None), 0), else_=1).label("n_loss"),
        s.loss.label("sum_loss"),
        sa.case((s.lr.is_(None), 0), else_=1).label("n_lr"),
        s.lr.label("sum_lr"),
        s.examples.label("examples_max"),
        s.time.label("time_min"),
        s.time.label("time_max"),
        s.b_big.label("b_big_max"),
    )


def _block_rows() -> Any:
    b = SampleBlock
    return sa.select(
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


def _sizes(conn: sa.Connection, run_ids: Sequence[int] | None = None) -> dict[int, int]:
    """Whole-model sample count per run, from the block table (cheap at any run length)."""
    q = (
        sa.select(SampleBlock.run_id, sa.func.sum(SampleBlock.n))
        .where(SampleBlock.series == "")
        .group_by(SampleBlock.run_id)
    )
    if run_ids is not None:
        q = q.where(SampleBlock.run_id.in_(list(run_ids)))
    return {int(r): int(n or 0) for r, n in conn.execute(q)}


def _rows(
    conn: sa.Connection, run_ids: Sequence[int], series: Sequence[str], min_blocks: float
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
        parts.append(_sample_rows().where(sa.false()))
    combined: Any = parts[0] if len(parts) == 1 else sa.union_all(parts[0], parts[1])
    return combined.subquery("rows")


_RUN_COLUMNS = [
    "uid",
    "project",
    "task",
    "name",
    "tags",
    "config",
    "status",
    "batch_size",
    "units",
    "started_at",
    "ended_at",
    "last_seen_at",
    "n_samples",
    "last_step",
    "loss",
    "b_simple",
    "b_simple_lo",
    "b_simple_hi",
    "b_simple_reason",
    "batch_in_use",
]


@st.cache_data(ttl=TTL_S, show_spinner=False)
def list_runs(url: str) -> pd.DataFrame:
    """All runs, newest first, with their current B_simple and interval (``queries.list_runs``:
    the last ``queries.RECENT_WINDOW`` samples, interval by block jackknife + Fieller)."""
    summaries = queries.list_runs(get_engine(url), limit=100_000)
    rows = [
        {
            **{k: getattr(r, k) for k in _RUN_COLUMNS if hasattr(r, k)},
            "loss": r.last_loss,
            "batch_in_use": r.batch_size,
        }
        for r in summaries
    ]
    frame = pd.DataFrame(rows, columns=_RUN_COLUMNS)
    for col in ("batch_size", "b_simple", "b_simple_lo", "b_simple_hi", "loss", "last_step"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype(float)
    frame["batch_in_use"] = frame["batch_size"]
    return frame


@st.cache_data(ttl=TTL_S, show_spinner=False)
def series_names(url: str, uid: str) -> list[str]:
    """The series a run has: "" for the whole model, then per-layer / per-group names."""
    return [info.name for info in queries.series_names(get_engine(url), uid)]


def raw_samples_csv(url: str, uid: str) -> str:
    """Every raw sample of a run as CSV (``queries.raw_samples_csv``), built on demand only."""
    return "".join(queries.raw_samples_csv(get_engine(url), uid))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def runs_series(
    url: str,
    uids: Sequence[str],
    series: Sequence[str] = ("",),
    max_points: int = MAX_POINTS,
    min_blocks: float | None = None,
) -> pd.DataFrame:
    """Bucketed sums for several runs and series in one query, at most ``max_points`` each.

    Buckets split each (run, series) step range evenly; per bucket the exact sums of |𝒢|^2
    and 𝒮 and the sample count, the last step/examples/time, the mean loss and lr, and the
    largest B_big (the batch in use). Columns: run, series, bucket, n, sum_g_sq,
    sum_trace_sigma, step, examples, time, loss, lr, batch_size.

    Runs with at least ``min_blocks`` pre-summed blocks (default: one per requested point) are
    read from ``sample_block``; the Compare pages accept coarser buckets for speed.
    """
    if not uids:
        return _empty_series()
    max_points = max(1, min(int(max_points), MAX_POINTS))
    with get_engine(url).connect() as conn:
        ids = dict(conn.execute(sa.select(Run.uid, Run.id).where(Run.uid.in_(list(uids)))).all())
        rows = _rows(
            conn,
            [int(i) for i in ids.values()],
            list(series),
            max_points * BLOCKS_PER_POINT if min_blocks is None else min_blocks,
        )
        stats = (
            sa.select(
                rows.c.run_id,
                rows.c.series,
                sa.func.min(rows.c.step_lo).label("mn"),
                sa.func.max(rows.c.step_hi).label("mx"),
                sa.func.min(rows.c.time_min).label("t0"),
            )
            .group_by(rows.c.run_id, rows.c.series)
            .subquery("stats")
        )
        bucket = sa.cast(
            (rows.c.step_lo - stats.c.mn) * max_points / (stats.c.mx - stats.c.mn + 1), sa.Integer
        ).label("bucket")
        q = (
            sa.select(
                Run.uid.label("run"),
                rows.c.series,
                bucket,
                sa.func.sum(rows.c.n).label("n"),
                sa.func.sum(rows.c.sum_g_sq).label("sum_g_sq"),
                sa.func.sum(rows.c.sum_trace_sigma).label("sum_trace_sigma"),
                sa.func.max(rows.c.step_hi).label("step"),
                sa.func.max(rows.c.examples_max).label("examples"),
                (sa.func.max(rows.c.time_max) - sa.func.min(stats.c.t0)).label("time"),
                (
                    sa.func.sum(rows.c.sum_loss) / sa.func.nullif(sa.func.sum(rows.c.n_loss), 0)
                ).label("loss"),
                (sa.func.sum(rows.c.sum_lr) / sa.func.nullif(sa.func.sum(rows.c.n_lr), 0)).label(
                    "lr"
                ),
                sa.func.max(rows.c.b_big_max).label("batch_size"),
            )
            .join(
                stats,
                sa.and_(stats.c.run_id == rows.c.run_id, stats.c.series == rows.c.series),
            )
            .join(Run, Run.id == rows.c.run_id)
            .group_by(Run.uid, rows.c.series, bucket)
            .order_by(Run.uid, rows.c.series, bucket)
        )
        frame = _frame(conn.execute(q))
    if frame.empty:
        return _empty_series()
    for col in ("sum_g_sq", "sum_trace_sigma", "examples", "time", "loss", "lr", "batch_size"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype(float)
    return frame


def _empty_series() -> pd.DataFrame:
    cols = [
        "run",
        "series",
        "bucket",
        "n",
        "sum_g_sq",
        "sum_trace_sigma",
        "step",
        "examples",
        "time",
        "loss",
        "lr",
        "batch_size",
    ]
    return pd.DataFrame({c: pd.Series(dtype="float") for c in cols})


@st.cache_data(ttl=TTL_S, show_spinner=False)
def run_events(url: str, uid: str) -> pd.DataFrame:
    """Events of a run (batch-size changes first of all) with a short text label each."""
    events = queries.run_events(get_engine(url), uid)
    return pd.DataFrame(
        {
            "step": [e.step for e in events],
            "kind": [e.kind for e in events],
            "label": [_event_label(e.kind, e.payload) for e in events],
            "time": [e.time for e in events],
        },
        columns=["step", "kind", "label", "time"],
    )


def _event_label(kind: str, payload: Any) -> str:
    if isinstance(payload, dict):
        if "batch_size" in payload:
            old = payload.get("old_batch_size", payload.get("from"))
            prefix = f"{_num(old)} → " if old is not None else ""
            return f"batch size {prefix}{_num(payload['batch_size'])}"
        return ", ".join(f"{k}={v}" for k, v in list(payload.items())[:4]) or kind
    return kind


def _num(value: Any) -> str:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return str(value)
    return f"{f:.6g}" if math.isfinite(f) else str(value)
