"""The dashboard's only source of numbers: the server's HTTP API through ``noisescope.Api``.

Every value a page shows is an answer of the API (the result classes of ``noisescope``,
``noisescope.sweep`` and ``noisescope.recommend``), so a notebook calling ``noisescope.Api``
reads exactly what the pages show. One ``Api`` (a keep-alive HTTP session) per server and
token for the whole Streamlit process; answers are cached for ``TTL_S`` seconds, since live
runs keep moving. Nothing here computes: it fetches.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

import streamlit as st

from noisescope import (
    Api,
    ApiError,
    EventRow,
    ParallelismPlan,
    RunBranches,
    RunSeries,
    RunSummary,
    SeriesInfo,
    TaskSummary,
)
from noisescope.forecast import ForecastReport
from noisescope.sweep import CriticalBatchReport, declared_targets

__all__ = [
    "LIVE_EVERY",
    "TOKEN_ENV",
    "TTL_S",
    "URL_ENV",
    "Source",
    "api",
    "branches",
    "compare",
    "critical_batch",
    "critical_batch_forecast",
    "default_targets",
    "event_counts",
    "events",
    "newest_runs",
    "parallelism",
    "projects",
    "run",
    "run_list",
    "runs",
    "samples_csv",
    "series",
    "series_names",
    "source",
    "sweep_report",
    "tasks",
]

URL_ENV = "NOISESCOPE_URL"
TOKEN_ENV = "NOISESCOPE_TOKEN"
#: Cache lifetime of every answer: short, since live runs keep adding samples.
TTL_S = 5.0
#: How often a page showing a running run re-reads it: as often as its answers expire.
LIVE_EVERY = timedelta(seconds=TTL_S)
#: Seconds to wait for one answer (a critical-batch analysis of a large sweep takes a while).
TIMEOUT_S = 60.0

XAxis = Literal["step", "examples", "time"]


@dataclass(frozen=True)
class Source:
    """The server the dashboard reads and the token it reads with (a project token limits
    every answer to that project)."""

    url: str
    token: str | None = None


def source() -> Source | None:
    """The server from ``NOISESCOPE_URL`` (set by ``noisescope up`` / ``noisescope dashboard``)
    and the token from ``NOISESCOPE_TOKEN``; None when no URL is set."""
    url = os.environ.get(URL_ENV, "").strip().rstrip("/")
    if not url:
        return None
    token = os.environ.get(TOKEN_ENV, "").strip() or None
    return Source(url, token)


@st.cache_resource(show_spinner=False)
def api(src: Source) -> Api:
    """One client per server and token, shared by every session (never copied)."""
    return Api(src.url, token=src.token or "", timeout=TIMEOUT_S)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def can_manage(src: Source) -> bool:
    """Whether the dashboard's token may rename, tag, archive and delete runs (the ``manage``
    scope; docs/deployment.md gives the dashboard a read token). A server that cannot say
    (one from before scopes) is let answer each change itself."""
    try:
        return "manage" in api(src).access().scopes
    except ApiError:
        return True


@st.cache_data(ttl=TTL_S, show_spinner=False)
def projects(src: Source) -> list[str]:
    return api(src).projects()


@st.cache_data(ttl=TTL_S, show_spinner=False)
def runs(src: Source) -> list[RunSummary]:
    """Every run the token may read (the newest ``protocol.MAX_RUNS_LISTED``, what one list
    answers), newest first, each with its current B_simple."""
    return api(src).runs()


@st.cache_data(ttl=TTL_S, show_spinner=False)
def newest_runs(src: Source, n: int) -> list[RunSummary]:
    """The newest ``n`` runs, as ``runs`` has them: what a page draws while it reads the rest."""
    return api(src).runs(limit=n)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def run_list(src: Source) -> list[RunSummary]:
    """Every run the token may read, without the current B_simple: for pickers and labels,
    at a fraction of the server's cost (never show its ``b_simple`` fields)."""
    return api(src).runs(current=False)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def run(src: Source, run_id: str) -> RunSummary:
    """One run (``NotFoundError`` for an unknown id)."""
    return api(src).run(run_id)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def series(
    src: Source, run_id: str, x: XAxis = "step", name: str = "", window: float = 0.0
) -> RunSeries:
    """A run's curves bucketed by the server; ``window`` steps of trailing smoothing (0: none)."""
    return api(src).series(run_id, x=x, series=name, window=window or None)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def compare(src: Source, run_ids: Sequence[str], window_fraction: float) -> list[RunSeries]:
    """Whole-model curves of several runs, each smoothed over the same fraction of itself."""
    return api(src).compare(list(run_ids), window_fraction=window_fraction)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def series_names(src: Source, run_id: str) -> list[SeriesInfo]:
    return api(src).series_names(run_id)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def events(
    src: Source,
    run_id: str,
    kinds: tuple[str, ...] | None = None,
    exclude_kinds: tuple[str, ...] = (),
    max_events: int | None = None,
) -> list[EventRow]:
    """A run's events of ``kinds`` (None: all) but not ``exclude_kinds``, at most
    ``max_events`` of them spread over the run (the server picks every k-th)."""
    return api(src).events(run_id, kinds=kinds, exclude_kinds=exclude_kinds, max_events=max_events)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def event_counts(src: Source, run_id: str) -> dict[str, int]:
    """How many events of each kind the run holds."""
    return api(src).event_counts(run_id)


def samples_csv(src: Source, run_id: str) -> str:
    """Every raw sample of a run as CSV, fetched only when the download is clicked."""
    return api(src).samples_csv(run_id)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def tasks(src: Source) -> list[TaskSummary]:
    return api(src).tasks()


@st.cache_data(ttl=TTL_S, show_spinner=False)
def critical_batch(
    src: Source,
    project: str,
    task: str,
    targets: Sequence[float] = (),
    loss: Literal["auto", "eval", "train"] = "auto",
) -> CriticalBatchReport:
    """B_crit per loss target (the report's default targets when ``targets`` is empty)."""
    return api(src).critical_batch(project, task, targets=list(targets) or None, loss=loss)


def default_targets(src: Source, project: str, task: str) -> tuple[float, ...]:
    """The loss targets the task's sweep names in its runs' configs
    (``noisescope.sweep.declared_targets``: what ``python -m experiments`` analysed it at),
    which every page reads the sweep at by default; () when its runs name none, and the
    server's ``default_targets`` apply."""
    configs = [
        r.config
        for r in run_list(src)
        if (r.project, r.task) == (project, task) and r.parent_uid is None
    ]
    return tuple(declared_targets(configs))


def sweep_report(src: Source, project: str, task: str) -> CriticalBatchReport:
    """The task's critical batch at its default targets (``default_targets``), as the
    Critical batch size page opens on it."""
    return critical_batch(src, project, task, default_targets(src, project, task))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def branches(src: Source, run_id: str) -> RunBranches:
    """The run's branch points with their local critical batch sizes."""
    return api(src).branches(run_id)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def critical_batch_forecast(
    src: Source, project: str, task: str, losses: Sequence[float]
) -> ForecastReport:
    """The task's B_crit(L) law across its sweep targets, predicted at ``losses``."""
    return api(src).critical_batch_forecast(project, task, losses=list(losses))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def parallelism(
    src: Source,
    b_crit: float,
    per_device_batch: float,
    *,
    s_min: float | None,
    step_time: float | None,
    min_speedup: float,
    units: str,
    batch_size: float | None,
    reference: str,
) -> ParallelismPlan:
    return api(src).parallelism(
        b_crit,
        per_device_batch,
        s_min=s_min,
        step_time=step_time,
        min_speedup=min_speedup,
        units=units,
        batch_size=batch_size,
        reference=reference,
    )
