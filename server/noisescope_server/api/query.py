"""The JSON query API: every number the dashboard (and ``noisescope.Api``) shows comes from here.

Answers are the dataclasses of ``noisescope.protocol`` and ``noisescope.sweep``, which
``noisescope.Api`` decodes back into the same classes.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated
from urllib.parse import unquote

import orjson
from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import Response, StreamingResponse

from noisescope import protocol
from noisescope.estimators import MIN_SPEEDUP
from noisescope.protocol import (
    EventRow,
    ParallelismPlan,
    RunSeries,
    RunSummary,
    SeriesInfo,
    TaskSummary,
)
from noisescope.recommend import MAX_DEVICES, Reference, parallelism_plan
from noisescope.sweep import CriticalBatchReport
from noisescope_server import queries, sweeps
from noisescope_server.api.deps import EngineDep, ReadScope, SettingsDep
from noisescope_server.api.run_ids import check_run_ids
from noisescope_server.api.schemas import Units
from noisescope_server.errors import value_errors_as_bad_input

router = APIRouter(tags=["query"])

# Routes that look alike (a run id and the caller's scope in, one query's answer out; the same
# Annotated query parameters) stay one function each, here and in api/branching.py and
# api/recommend.py: FastAPI reads a route's parameters, their documentation and its OpenAPI
# operation from the function's own signature, so a shared route factory would hide each
# endpoint's contract from the schema's reader and from mypy. What they share lives below
# them: the reads in ``queries``, the encoding in ``_json``.


def _json(result: object) -> Response:
    """orjson encodes the query dataclasses directly (2000-point series: a few ms, not tens);
    ``response_model`` still documents the shape in the OpenAPI schema."""
    return Response(orjson.dumps(result), media_type="application/json")


@router.get("/projects", response_model=list[str], summary="Project names")
def get_projects(engine: EngineDep, scope: ReadScope) -> list[str]:
    return queries.list_projects(engine, project_scope=scope)


@router.get("/runs", response_model=list[RunSummary], summary="List and filter runs")
def get_runs(
    engine: EngineDep,
    settings: SettingsDep,
    scope: ReadScope,
    project: str | None = None,
    task: str | None = None,
    tag: str | None = None,
    status: Annotated[
        str | None,
        Query(description='as read: "crashed" includes running runs silent for crash_after'),
    ] = None,
    search: Annotated[
        str | None,
        Query(
            max_length=protocol.MAX_NAME_LENGTH,
            description="substring of the name, id or task (at most as long as a name)",
        ),
    ] = None,
    started_after: datetime | None = None,
    started_before: datetime | None = None,
    limit: Annotated[int, Query(ge=1, le=protocol.MAX_RUNS_LISTED)] = 200,
    current: Annotated[
        bool,
        Query(
            description="compute each run's current B_simple (false: a cheaper list whose "
            "b_simple fields are null, for pickers)"
        ),
    ] = True,
    archived: Annotated[
        queries.Archived,
        Query(description='archived runs: left out ("exclude"), listed too ("include") or alone'),
    ] = "exclude",
) -> Response:
    return _json(
        queries.list_runs(
            engine,
            project=project,
            task=task,
            tag=tag,
            status=status,
            search=search,
            started_after=started_after,
            started_before=started_before,
            limit=limit,
            project_scope=scope,
            current=current,
            crash_after=settings.crash_after,
            archived=archived,
        )
    )


@router.get("/runs/{run_id}", response_model=RunSummary, summary="One run")
def get_run(run_id: str, engine: EngineDep, settings: SettingsDep, scope: ReadScope) -> Response:
    return _json(
        queries.get_run(engine, run_id, project_scope=scope, crash_after=settings.crash_after)
    )


@router.get(
    "/runs/{run_id}/series",
    response_model=RunSeries,
    summary="A run's |G|^2, tr(Sigma), B_simple, loss bucketed server-side to <= max_points",
)
def get_series(
    run_id: str,
    engine: EngineDep,
    scope: ReadScope,
    x: queries.XAxis = "step",
    max_points: Annotated[int, Query(ge=1, le=20_000)] = 2000,
    series: str = "",
    window: Annotated[
        float,
        Query(
            ge=0,
            le=1e15,
            description="smooth by trailing windows of this many steps (0: each bucket alone); "
            "never changes the run's current B_simple",
        ),
    ] = 0.0,
) -> Response:
    return _json(
        queries.run_series(
            engine,
            run_id,
            x=x,
            max_points=max_points,
            series=series,
            window=window,
            project_scope=scope,
        )
    )


@router.get(
    "/series",
    response_model=list[RunSeries],
    summary="Whole-model series of several runs, each smoothed over a fraction of its length",
)
def get_compare_series(
    engine: EngineDep,
    scope: ReadScope,
    runs: Annotated[list[str], Query(min_length=1, max_length=200, description="run ids")],
    max_points: Annotated[int, Query(ge=1, le=2000)] = 400,
    window_fraction: Annotated[float, Query(ge=0, le=1)] = 0.1,
    archived: Annotated[
        queries.Archived,
        Query(description='archived runs: left out ("exclude"), compared too ("include")'),
    ] = "exclude",
) -> Response:
    check_run_ids(runs)
    return _json(
        queries.compare_series(
            engine,
            runs,
            max_points=max_points,
            window_fraction=window_fraction,
            project_scope=scope,
            archived=archived,
        )
    )


@router.get(
    "/runs/{run_id}/series-names",
    response_model=list[SeriesInfo],
    summary="Series of a run",
)
def get_series_names(run_id: str, engine: EngineDep, scope: ReadScope) -> Response:
    return _json(queries.series_names(engine, run_id, project_scope=scope))


@router.get("/runs/{run_id}/events", response_model=list[EventRow], summary="Events of a run")
def get_events(
    run_id: str,
    engine: EngineDep,
    scope: ReadScope,
    kind: Annotated[
        list[str] | None, Query(max_length=100, description="only events of these kinds")
    ] = None,
    exclude_kind: Annotated[
        list[str] | None, Query(max_length=100, description="no events of these kinds")
    ] = None,
    max_events: Annotated[
        int | None,
        Query(
            ge=1,
            description="at most this many, spread over the run: every k-th matching event in "
            "step order, from the first (GET /runs/{run_id}/event-counts says how many there are)",
        ),
    ] = None,
) -> Response:
    return _json(
        queries.run_events(
            engine,
            run_id,
            kinds=kind,
            exclude_kinds=exclude_kind or (),
            max_events=max_events,
            project_scope=scope,
        )
    )


@router.get(
    "/runs/{run_id}/event-counts",
    response_model=dict[str, int],
    summary="How many events of each kind a run holds",
)
def get_event_counts(run_id: str, engine: EngineDep, scope: ReadScope) -> Response:
    return _json(queries.event_counts(engine, run_id, project_scope=scope))


@router.get(
    "/runs/{run_id}/samples.csv",
    response_class=StreamingResponse,
    summary="Raw samples as CSV (streamed)",
    responses={200: {"content": {"text/csv": {}}}},
)
def get_samples_csv(
    run_id: str, engine: EngineDep, scope: ReadScope, series: str | None = None
) -> StreamingResponse:
    chunks = queries.raw_samples_csv(engine, run_id, series=series, project_scope=scope)
    return StreamingResponse(
        chunks,
        media_type="text/csv",
        headers={"Content-Disposition": f'attachment; filename="{run_id}.csv"'},
    )


@router.get("/tasks", response_model=list[TaskSummary], summary="Tasks across runs")
def get_tasks(
    engine: EngineDep, settings: SettingsDep, scope: ReadScope, project: str | None = None
) -> Response:
    return _json(
        queries.task_summaries(
            engine, project, project_scope=scope, crash_after=settings.crash_after
        )
    )


@router.get(
    "/tasks/{project}/{task:path}/critical-batch",
    response_model=CriticalBatchReport,
    summary="B_crit per loss target from the task's batch-size sweep, with B_simple at that loss",
)
def get_critical_batch(
    project: str,
    task: str,
    request: Request,
    engine: EngineDep,
    settings: SettingsDep,
    scope: ReadScope,
    targets: Annotated[
        list[float] | None,
        Query(max_length=50, description="loss targets (default: every batch size reaches them)"),
    ] = None,
    loss: Annotated[
        sweeps.LossChoice,
        Query(description="cross targets on eval losses, training losses, or auto"),
    ] = "auto",
    include_diverged: Annotated[
        bool,
        Query(description="keep runs whose loss diverged (default: left out, under excluded)"),
    ] = False,
) -> Response:
    chosen = _loss_targets(targets)
    project, task = _task_path(request, project, task)
    return _json(
        sweeps.critical_batch(
            engine,
            project,
            task,
            targets=chosen,
            loss=loss,
            project_scope=scope,
            crash_after=settings.crash_after,
            include_diverged=include_diverged,
        )
    )


def _loss_targets(targets: list[float] | None) -> list[float]:
    """The sweep's loss targets as asked for (empty: its defaults), or 422 unless all finite."""
    chosen = targets or []
    if any(not math.isfinite(t) for t in chosen):
        raise HTTPException(422, "targets must be finite numbers")
    return chosen


def _task_path(
    request: Request, project: str, task: str, suffix: str = "critical-batch"
) -> tuple[str, str]:
    """Project and task from the undecoded path, so that a name holding "/" (sent as %2F)
    stays one name: the router sees the path after percent-decoding. ``suffix``: the path's
    segments after the task."""
    raw = request.scope.get("raw_path")
    if not isinstance(raw, bytes):
        return project, task
    parts = raw.decode("latin-1").split("?", 1)[0].split("/")
    tail = suffix.split("/")
    try:
        start = parts.index("tasks")
    except ValueError:
        return project, task
    names = parts[start + 1 : -len(tail)]
    if len(names) < 2 or parts[-len(tail) :] != tail:
        return project, task
    return unquote(names[0]), unquote("/".join(names[1:]))


#: The smallest batch size (and B_crit) /parallelism takes: any two of them, and 2^24 devices of
#: the largest (1e18), then stay within the floating-point range in every row.
_TINY_BATCH = 1e-6


@router.get(
    "/parallelism",
    response_model=ParallelismPlan,
    summary="Devices past which each doubling buys less than min_speedup (S-E model at B_crit)",
)
def get_parallelism(
    b_crit: Annotated[float, Query(ge=_TINY_BATCH, le=1e18, description="critical batch size")],
    per_device_batch: Annotated[float, Query(ge=_TINY_BATCH, le=1e18)],
    s_min: Annotated[float | None, Query(gt=0, le=1e18, description="from a sweep fit")] = None,
    step_time: Annotated[float | None, Query(gt=0, le=1e9, description="seconds per step")] = (
        None
    ),
    min_speedup: Annotated[float, Query(gt=1, lt=2)] = MIN_SPEEDUP,
    max_devices: Annotated[int | None, Query(ge=1, le=MAX_DEVICES)] = None,
    units: Units = "examples",
    batch_size: Annotated[
        float | None,
        Query(ge=_TINY_BATCH, le=1e18, description="a batch to give a verdict on"),
    ] = None,
    reference: Annotated[
        Reference,
        Query(description="what b_crit is: a sweep fit's B_crit or a B_simple taken as B_crit"),
    ] = "B_crit",
) -> Response:
    with value_errors_as_bad_input():  # e.g. more devices than max_devices allows
        plan = parallelism_plan(
            b_crit,
            per_device_batch,
            s_min=s_min,
            step_time=step_time,
            min_speedup=min_speedup,
            max_devices=max_devices,
            units=units,
            batch_size=batch_size,
            reference=reference,
        )
    return _json(plan)
