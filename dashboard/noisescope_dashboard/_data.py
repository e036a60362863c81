"""The dashboard's reads: every query aggregates in SQL and returns small frames.

Every read goes through the server's read module (``noisescope_server.queries``), the same
one the HTTP query API uses; this module turns its results into small pandas frames and
caches them.

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
    """Bucketed sums for several runs and series, at most ``max_points`` each
    (``queries.bucket_sums``): one row per bucket, columns ``_SERIES_COLUMNS``."""
    max_points = max(1, min(int(max_points), MAX_POINTS))
    buckets = queries.bucket_sums(
        get_engine(url), uids, series=series, max_points=max_points, min_blocks=min_blocks
    )
    # vars(): the dataclass fields in order, without asdict's deep copy of 40k rows
    frame = pd.DataFrame([list(vars(b).values()) for b in buckets], columns=_SERIES_COLUMNS)
    if frame.empty:
        return _empty_series()
    for col in ("sum_g_sq", "sum_trace_sigma", "examples", "time", "loss", "lr", "batch_size"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype(float)
    return frame


#: ``queries.BucketSums`` fields, in order, with ``run_uid`` as ``run``.
_SERIES_COLUMNS = [
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


def _empty_series() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="float") for c in _SERIES_COLUMNS})


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
