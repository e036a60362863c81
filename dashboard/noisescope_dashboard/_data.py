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
from noisescope_server.models import Event, Project, Run, Sample, Task

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


@st.cache_data(ttl=TTL_S, show_spinner=False)
def list_runs(url: str) -> pd.DataFrame:
    """All runs with project, task, config and their *current* B_simple window sums.

    The current window is the last 10% of each run's steps on the whole-model series,
    cut into ``CURRENT_BLOCKS`` blocks whose sums the interval is computed from.
    """
    engine = get_engine(url)
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
    whole = Sample.series == ""
    stats = (
        sa.select(
            Sample.run_id,
            sa.func.min(Sample.step).label("mn"),
            sa.func.max(Sample.step).label("mx"),
        )
        .where(whole)
        .group_by(Sample.run_id)
        .subquery()
    )
    width_raw = (stats.c.mx - stats.c.mn + 1) / 10
    width = sa.case((width_raw < 1, 1), else_=width_raw)
    first = stats.c.mx - width + 1
    block = sa.cast((Sample.step - first) * CURRENT_BLOCKS / width, sa.Integer).label("block")
    blocks_q = (
        sa.select(
            Sample.run_id,
            block,
            sa.func.count().label("n"),
            sa.func.sum(Sample.g_sq_est).label("sum_g_sq"),
            sa.func.sum(Sample.trace_sigma_est).label("sum_trace_sigma"),
            sa.func.avg(Sample.loss).label("loss"),
            sa.func.avg(Sample.b_big).label("batch_in_use"),
            sa.func.max(Sample.step).label("last_step"),
        )
        .join(stats, stats.c.run_id == Sample.run_id)
        .where(whole, Sample.step >= first)
        .group_by(Sample.run_id, block)
        .order_by(Sample.run_id, block)
    )
    with engine.connect() as conn:
        runs = _frame(conn.execute(runs_q))
        blocks = _frame(conn.execute(blocks_q))
    return _attach_current(runs, blocks)


def _attach_current(runs: pd.DataFrame, blocks: pd.DataFrame) -> pd.DataFrame:
    from ._model import block_interval

    from noisescope.estimators import NoiseScale

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
    grouped = {rid: g for rid, g in blocks.groupby("run_id")} if not blocks.empty else {}
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
        out[k] = pd.Series(v, index=out.index, dtype="object" if k == "b_simple_reason" else "float")
    return out


@st.cache_data(ttl=TTL_S, show_spinner=False)
def series_names(url: str, uid: str) -> list[str]:
    """The series a run has: "" for the whole model, then per-layer / per-group names."""
    q = (
        sa.select(Sample.series)
        .join(Run, Run.id == Sample.run_id)
        .where(Run.uid == uid)
        .group_by(Sample.series)
        .order_by(Sample.series)
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
    and 𝒮 and the sample count, the last step/examples/time, the mean loss, lr and B_big (the
    batch in use). Columns: run, series, bucket, n, sum_g_sq, sum_trace_sigma, step, examples,
    time, loss, lr, batch_size.
    """
    if not uids:
        return _empty_series()
    max_points = max(1, min(int(max_points), MAX_POINTS))
    uid_list = list(uids)
    series_list = list(series)
    stats = (
        sa.select(
            Sample.run_id,
            Sample.series,
            sa.func.min(Sample.step).label("mn"),
            sa.func.max(Sample.step).label("mx"),
            sa.func.min(Sample.time).label("t0"),
        )
        .join(Run, Run.id == Sample.run_id)
        .where(Run.uid.in_(uid_list), Sample.series.in_(series_list))
        .group_by(Sample.run_id, Sample.series)
        .subquery()
    )
    bucket = sa.cast(
        (Sample.step - stats.c.mn) * max_points / (stats.c.mx - stats.c.mn + 1), sa.Integer
    ).label("bucket")
    q = (
        sa.select(
            Run.uid.label("run"),
            Sample.series,
            bucket,
            sa.func.count().label("n"),
            sa.func.sum(Sample.g_sq_est).label("sum_g_sq"),
            sa.func.sum(Sample.trace_sigma_est).label("sum_trace_sigma"),
            sa.func.max(Sample.step).label("step"),
            sa.func.max(Sample.examples).label("examples"),
            (sa.func.max(Sample.time) - sa.func.min(stats.c.t0)).label("time"),
            sa.func.avg(Sample.loss).label("loss"),
            sa.func.avg(Sample.lr).label("lr"),
            sa.func.avg(Sample.b_big).label("batch_size"),
        )
        .join(
            stats,
            sa.and_(stats.c.run_id == Sample.run_id, stats.c.series == Sample.series),
        )
        .join(Run, Run.id == Sample.run_id)
        .group_by(Run.uid, Sample.series, bucket)
        .order_by(Run.uid, Sample.series, bucket)
    )
    with get_engine(url).connect() as conn:
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
    frame["label"] = [_event_label(k, p) for k, p in zip(frame["kind"], frame["payload"], strict=True)]
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
