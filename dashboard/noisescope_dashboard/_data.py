"""The dashboard's reads: every query aggregates in SQL and returns small frames.

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

from noisescope_server.models import Event, Project, Run, Sample, SampleBlock, Task

from ._charts import MAX_POINTS

__all__ = [
    "DATABASE_URL_ENV",
    "TTL_S",
    "database_url",
    "get_engine",
    "list_runs",
    "run_events",
    "runs_series",
    "series_names",
]

DATABASE_URL_ENV = "NOISESCOPE_DATABASE_URL"
#: Cache lifetime of database reads: short, since live runs keep adding samples.
TTL_S = 5.0
#: Blocks the "current B_simple" window is cut into for its interval.
CURRENT_BLOCKS = 10


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


#: Runs with at most this many samples (per series) are bucketed from ``sample`` itself, so
#: short runs keep per-step resolution; longer ones from the server's 64-sample
#: ``sample_block`` sums, so a 1M-sample run costs ~16k rows, not 1M.
SMALL_RUN_SAMPLES = 64 * MAX_POINTS


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


def _rows(conn: sa.Connection, run_ids: Sequence[int], series: Sequence[str]) -> Any:
    """Sample rows for short runs and block rows for long ones, as one subquery."""
    sizes = _sizes(conn, run_ids)
    small = [r for r in run_ids if sizes.get(r, 0) <= SMALL_RUN_SAMPLES]
    big = [r for r in run_ids if sizes.get(r, 0) > SMALL_RUN_SAMPLES]
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


@st.cache_data(ttl=TTL_S, show_spinner=False)
def list_runs(url: str) -> pd.DataFrame:
    """All runs with project, task, config and their *current* B_simple window sums.

    The current window is the last 10% of each run's steps on the whole-model series, cut
    into ``CURRENT_BLOCKS`` blocks whose sums the interval is computed from.
    """
    runs_q = (
        sa.select(
            Run.id.label("run_id"),
            Run.uid,
            Project.name.label("project"),
            Task.name.label("task"),
            Run.name,
            Run.tags,
            Run.config,
            Run.status,
            Run.batch_size,
            Run.units,
            Run.started_at,
            Run.ended_at,
            Run.last_seen_at,
        )
        .join(Project, Project.id == Run.project_id)
        .join(Task, Task.id == Run.task_id)
        .order_by(Run.started_at.desc())
    )
    with get_engine(url).connect() as conn:
        runs = _frame(conn.execute(runs_q))
        run_ids = [int(r) for r in runs["run_id"]] if not runs.empty else []
        rows = _rows(conn, run_ids, [""])
        stats = (
            sa.select(
                rows.c.run_id,
                sa.func.min(rows.c.step_lo).label("mn"),
                sa.func.max(rows.c.step_hi).label("mx"),
            )
            .group_by(rows.c.run_id)
            .subquery("stats")
        )
        width_raw = (stats.c.mx - stats.c.mn + 1) / 10
        width = sa.case((width_raw < 1, 1), else_=width_raw)
        first = stats.c.mx - width + 1
        block = sa.cast((rows.c.step_lo - first) * CURRENT_BLOCKS / width, sa.Integer).label(
            "block"
        )
        blocks_q = (
            sa.select(
                rows.c.run_id,
                block,
                sa.func.sum(rows.c.n).label("n"),
                sa.func.sum(rows.c.sum_g_sq).label("sum_g_sq"),
                sa.func.sum(rows.c.sum_trace_sigma).label("sum_trace_sigma"),
                (
                    sa.func.sum(rows.c.sum_loss) / sa.func.nullif(sa.func.sum(rows.c.n_loss), 0)
                ).label("loss"),
                sa.func.max(rows.c.b_big_max).label("batch_in_use"),
                sa.func.max(rows.c.step_hi).label("last_step"),
            )
            .join(stats, stats.c.run_id == rows.c.run_id)
            .where(rows.c.step_lo >= first)
            .group_by(rows.c.run_id, block)
            .order_by(rows.c.run_id, block)
        )
        blocks = _frame(conn.execute(blocks_q))
    return _attach_current(runs, blocks)


def _attach_current(runs: pd.DataFrame, blocks: pd.DataFrame) -> pd.DataFrame:
    from noisescope.estimators import NoiseScale

    from ._model import block_interval

    cols: dict[str, list[Any]] = {
        k: []
        for k in (
            "b_simple",
            "b_simple_lo",
            "b_simple_hi",
            "b_simple_reason",
            "loss",
            "last_step",
            "batch_in_use",
        )
    }
    grouped: dict[Any, pd.DataFrame] = {}
    if not blocks.empty:
        for rid, group in blocks.groupby("run_id"):
            grouped[rid] = group
    for rid in runs["run_id"] if not runs.empty else []:
        g = grouped.get(rid)
        if g is None:
            for k in cols:
                cols[k].append(None)
            cols["b_simple_reason"][-1] = "no samples yet"
            continue
        value = NoiseScale.from_sums(
            float(g["sum_g_sq"].sum()), float(g["sum_trace_sigma"].sum()), float(g["n"].sum())
        )
        lo, hi = block_interval(
            g["sum_g_sq"].astype(float).tolist(),
            g["sum_trace_sigma"].astype(float).tolist(),
            g["n"].astype(float).tolist(),
        )
        cols["b_simple"].append(value.b_simple)
        cols["b_simple_lo"].append(lo)
        cols["b_simple_hi"].append(hi)
        cols["b_simple_reason"].append(value.reason)
        cols["loss"].append(g["loss"].iloc[-1])
        cols["last_step"].append(int(g["last_step"].max()))
        cols["batch_in_use"].append(g["batch_in_use"].iloc[-1])
    out = runs.copy()
    for k, v in cols.items():
        out[k] = pd.Series(
            v, index=out.index, dtype="object" if k == "b_simple_reason" else "float"
        )
    return out


@st.cache_data(ttl=TTL_S, show_spinner=False)
def series_names(url: str, uid: str) -> list[str]:
    """The series a run has: "" for the whole model, then per-layer / per-group names."""
    q = (
        sa.select(SampleBlock.series)
        .join(Run, Run.id == SampleBlock.run_id)
        .where(Run.uid == uid)
        .group_by(SampleBlock.series)
        .order_by(SampleBlock.series)
    )
    with get_engine(url).connect() as conn:
        return [str(r[0]) for r in conn.execute(q)]


@st.cache_data(ttl=TTL_S, show_spinner=False)
def runs_series(
    url: str,
    uids: Sequence[str],
    series: Sequence[str] = ("",),
    max_points: int = MAX_POINTS,
) -> pd.DataFrame:
    """Bucketed sums for several runs and series in one query, at most ``max_points`` each.

    Buckets split each (run, series) step range evenly; per bucket the exact sums of |𝒢|^2
    and 𝒮 and the sample count, the last step/examples/time, the mean loss and lr, and the
    largest B_big (the batch in use). Columns: run, series, bucket, n, sum_g_sq,
    sum_trace_sigma, step, examples, time, loss, lr, batch_size.
    """
    if not uids:
        return _empty_series()
    max_points = max(1, min(int(max_points), MAX_POINTS))
    with get_engine(url).connect() as conn:
        ids = dict(conn.execute(sa.select(Run.uid, Run.id).where(Run.uid.in_(list(uids)))).all())
        rows = _rows(conn, [int(i) for i in ids.values()], list(series))
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
    q = (
        sa.select(Event.step, Event.kind, Event.payload, Event.time)
        .join(Run, Run.id == Event.run_id)
        .where(Run.uid == uid)
        .order_by(Event.step)
    )
    with get_engine(url).connect() as conn:
        frame = _frame(conn.execute(q))
    if frame.empty:
        return pd.DataFrame(columns=["step", "kind", "label", "time"])
    frame["label"] = [
        _event_label(k, p) for k, p in zip(frame["kind"], frame["payload"], strict=True)
    ]
    return frame.drop(columns=["payload"])


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
