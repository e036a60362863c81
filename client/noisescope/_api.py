"""``noisescope.Api``: read runs, series and analyses from a noisescope server.

In the spirit of ``wandb.Api()`` and ``MlflowClient``: plain method calls that return the
server's own answers as frozen dataclasses (``noisescope._results``, ``noisescope.sweep``),
with ``to_frame`` for pandas. The dashboard reads through this class and nothing else, so a
notebook sees exactly the numbers the pages show.

    api = noisescope.Api("http://127.0.0.1:8765")
    runs = api.runs(project="vision")
    report = api.critical_batch("vision", "digits")
    frame = api.series(runs[0].uid).to_frame()
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
import typing
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal, TypeVar, get_type_hints
from urllib.parse import quote, urlencode

from noisescope import _wire
from noisescope._config import DEFAULT_URL
from noisescope._results import (
    EventRow,
    ParallelismPlan,
    RunBranches,
    RunSeries,
    RunSummary,
    SeriesInfo,
    TaskSummary,
)
from noisescope._transport import HTTPTransport, Request, Transport, TransportError
from noisescope.estimators import MIN_SPEEDUP
from noisescope.forecast import ForecastReport
from noisescope.recommend import Recommendation
from noisescope.sweep import CriticalBatchReport

__all__ = ["Api", "ApiError", "NotFoundError", "RecommendationResult"]

T = TypeVar("T")

#: Runs per request of ``Api.compare`` (the server's limit on one query string).
COMPARE_CHUNK = 100


class ApiError(Exception):
    """The server answered with an error; ``status`` is its HTTP status, ``detail`` its words."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


class NotFoundError(ApiError):
    """404: no such run, task or project (or none this token may read)."""


@dataclasses.dataclass(frozen=True)
class RecommendationResult:
    """``GET /runs/{id}/recommendation``: the run's current B_simple turned into advice."""

    run_id: str
    units: str
    last_step: int | None
    window_samples: int
    #: Where ``recommendation.batch_size`` came from: "query", "event" or "run".
    batch_size_source: str
    recommendation: Recommendation


class Api:
    """Read access to one noisescope server.

    ``url`` defaults to ``$NOISESCOPE_URL`` (else the local default), ``token`` to
    ``$NOISESCOPE_TOKEN``: a project token limits every answer to its project.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        token: str | None = None,
        timeout: float = 60.0,
        transport: Transport | None = None,
    ) -> None:
        self.url = (url or os.environ.get("NOISESCOPE_URL") or DEFAULT_URL).rstrip("/")
        token = token if token is not None else (os.environ.get("NOISESCOPE_TOKEN") or None)
        self._transport = transport or HTTPTransport(self.url, token, timeout)

    def close(self) -> None:
        self._transport.close()

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- runs ---------------------------------------------------------------------------------
    def projects(self) -> list[str]:
        result: list[str] = _decode(list[str], self._get("/projects"))
        return result

    def runs(
        self,
        *,
        project: str | None = None,
        task: str | None = None,
        tag: str | None = None,
        status: str | None = None,
        search: str | None = None,
        limit: int = 10_000,
        current: bool = True,
    ) -> list[RunSummary]:
        """Runs, newest first, each with its current B_simple and the batch in use
        (``current=False``: without the current B_simple, a cheaper list for pickers)."""
        query = {
            "current": "true" if current else "false",
            "project": project,
            "task": task,
            "tag": tag,
            "status": status,
            "search": search,
            "limit": limit,
        }
        result: list[RunSummary] = _decode(list[RunSummary], self._get("/runs", query))
        return result

    def run(self, run_id: str) -> RunSummary:
        result: RunSummary = _decode(RunSummary, self._get(f"/runs/{_seg(run_id)}"))
        return result

    def series(
        self,
        run_id: str,
        *,
        x: Literal["step", "examples", "time"] = "step",
        series: str = "",
        max_points: int = 2000,
        window: float | None = None,
    ) -> RunSeries:
        """A run's |G|^2, tr(Sigma), B_simple, loss, lr, bucketed by the server to at most
        ``max_points``; ``window`` (steps) smooths by trailing windows of exact sums."""
        query: dict[str, Any] = {"x": x, "series": series, "max_points": max_points}
        if window:
            query["window"] = window
        result: RunSeries = _decode(RunSeries, self._get(f"/runs/{_seg(run_id)}/series", query))
        return result

    def compare(
        self, run_ids: Sequence[str], *, max_points: int = 400, window_fraction: float = 0.1
    ) -> list[RunSeries]:
        """Whole-model series of several runs, each smoothed over ``window_fraction`` of its
        own length (so runs of different lengths are smoothed alike)."""
        out: list[RunSeries] = []
        ids = list(run_ids)
        for lo in range(0, len(ids), COMPARE_CHUNK):
            query = {
                "runs": ids[lo : lo + COMPARE_CHUNK],
                "max_points": max_points,
                "window_fraction": window_fraction,
            }
            part: list[RunSeries] = _decode(list[RunSeries], self._get("/series", query))
            out += part
        return out

    def series_names(self, run_id: str) -> list[SeriesInfo]:
        result: list[SeriesInfo] = _decode(
            list[SeriesInfo], self._get(f"/runs/{_seg(run_id)}/series-names")
        )
        return result

    def events(self, run_id: str) -> list[EventRow]:
        """A run's events in step order (batch-size changes, evaluations, notices, marks)."""
        result: list[EventRow] = _decode(list[EventRow], self._get(f"/runs/{_seg(run_id)}/events"))
        return result

    def samples_csv(self, run_id: str) -> str:
        """Every raw sample of a run as CSV text."""
        return self._request(f"/runs/{_seg(run_id)}/samples.csv").decode("utf-8")

    def recommendation(
        self,
        run_id: str,
        *,
        batch_size: float | None = None,
        candidates: Sequence[float] | None = None,
        throughput: dict[float, float] | None = None,
    ) -> RecommendationResult:
        query: dict[str, Any] = {"batch_size": batch_size, "candidates": list(candidates or [])}
        if throughput:
            query["throughput"] = [f"{b:g}:{t:g}" for b, t in throughput.items()]
        path = f"/runs/{_seg(run_id)}/recommendation"
        result: RecommendationResult = _decode(RecommendationResult, self._get(path, query))
        return result

    # -- tasks --------------------------------------------------------------------------------
    def tasks(self, project: str | None = None) -> list[TaskSummary]:
        result: list[TaskSummary] = _decode(
            list[TaskSummary], self._get("/tasks", {"project": project})
        )
        return result

    def critical_batch(
        self,
        project: str,
        task: str,
        *,
        targets: Sequence[float] | None = None,
        loss: Literal["auto", "eval", "train"] = "auto",
        include_diverged: bool = False,
    ) -> CriticalBatchReport:
        """B_crit per loss target from the task's batch-size sweep (``noisescope.sweep``).

        A target's ``b_crit`` is None unless ``determined`` (its ``warnings`` say why);
        ``include_diverged`` keeps the runs whose loss diverged, left out by default."""
        path = f"/tasks/{_seg(project)}/{_seg(task)}/critical-batch"
        query: dict[str, Any] = {"targets": list(targets or []), "loss": loss}
        if include_diverged:
            query["include_diverged"] = "true"
        result: CriticalBatchReport = _decode(CriticalBatchReport, self._get(path, query))
        return result

    def branches(self, run_id: str) -> RunBranches:
        """The local critical batch size at each branch step of ``run_id``, recomputed from its
        branch runs (``noisescope.branch``), and where it plateaus."""
        result: RunBranches = _decode(RunBranches, self._get(f"/runs/{_seg(run_id)}/branches"))
        return result

    def critical_batch_forecast(
        self,
        project: str,
        task: str,
        *,
        losses: Sequence[float] = (),
        targets: Sequence[float] | None = None,
    ) -> ForecastReport:
        """B_crit(L) = B*·L^(-1/α_B) across the task's sweep targets, predicted at ``losses``
        (each marked ``extrapolation`` outside the fitted losses)."""
        path = f"/tasks/{_seg(project)}/{_seg(task)}/critical-batch/forecast"
        query = {"loss": list(losses), "targets": list(targets or [])}
        result: ForecastReport = _decode(ForecastReport, self._get(path, query))
        return result

    def parallelism(
        self,
        b_crit: float | None,
        per_device_batch: float,
        *,
        s_min: float | None = None,
        step_time: float | None = None,
        min_speedup: float = MIN_SPEEDUP,
        max_devices: int | None = None,
        units: str = "examples",
        batch_size: float | None = None,
        reference: str = "B_crit",
    ) -> ParallelismPlan:
        """How many devices pay off at ``b_crit``: each doubling's speed-up and waste (and,
        with ``batch_size``, a verdict on that batch). ``reference`` names what ``b_crit`` is,
        "B_crit" (a sweep fit) or "B_simple" (taken as B_crit), for the sentences.

        Raises ``ValueError`` for a ``b_crit`` that is None: a sweep target's ``b_crit`` is None
        unless it is ``determined``, and no plan is built on a number that is not one."""
        if b_crit is None:
            raise ValueError(
                "b_crit is None: this target's B_crit is not determined (see its warnings), so "
                "there is no plan to give; check TargetResult.determined first"
            )
        query = {
            "units": units,
            "batch_size": batch_size,
            "reference": reference,
            "b_crit": b_crit,
            "per_device_batch": per_device_batch,
            "s_min": s_min,
            "step_time": step_time,
            "min_speedup": min_speedup,
            "max_devices": max_devices,
        }
        result: ParallelismPlan = _decode(ParallelismPlan, self._get("/parallelism", query))
        return result

    # -- plumbing -----------------------------------------------------------------------------
    def _get(self, path: str, query: dict[str, Any] | None = None) -> Any:
        return json.loads(self._request(path, query))

    def _request(self, path: str, query: dict[str, Any] | None = None) -> bytes:
        pairs = [
            (k, v)
            for k, value in (query or {}).items()
            for v in (value if isinstance(value, list) else [value])
            if v is not None
        ]
        full = _wire.API_PREFIX + path + (f"?{urlencode(pairs)}" if pairs else "")
        try:
            response = self._transport.handle_request(Request("GET", full))
        except TransportError as exc:
            raise ApiError(0, f"no answer from {self.url}: {exc}") from exc
        if response.status == 404:
            raise NotFoundError(404, response.detail())
        if response.status >= 400:
            raise ApiError(response.status, response.detail())
        return response.body


def _seg(value: str) -> str:
    """One URL path segment: slashes and everything else escaped."""
    return quote(value, safe="")


# --- JSON -> dataclasses -------------------------------------------------------------------


def _decode(tp: Any, value: Any) -> Any:
    """``value`` (parsed JSON) as an instance of the type ``tp``: dataclasses by field types,
    lists, tuples, dicts, optionals, datetimes (ISO 8601) and numbers."""
    if value is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        return _decode(options[0], value) if len(options) == 1 else value
    if origin is list:
        (item,) = typing.get_args(tp)
        return [_decode(item, v) for v in value]
    if origin is tuple:
        item = typing.get_args(tp)[0]
        return tuple(_decode(item, v) for v in value)
    if origin is dict:
        return dict(value)
    if origin is Literal:
        return value
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        hints = _hints(tp)
        kwargs = {
            f.name: _decode(hints[f.name], value[f.name])
            for f in dataclasses.fields(tp)
            if f.name in value
        }
        return tp(**kwargs)
    if tp is datetime:
        return datetime.fromisoformat(value)
    if tp is float:
        return float(value)
    return value


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(tp: type) -> dict[str, Any]:
    hints = _HINTS.get(tp)
    if hints is None:
        hints = _HINTS[tp] = get_type_hints(tp)
    return hints
