"""The JSON query API (shared with the dashboard through ``noisescope_server.queries``)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import orjson
from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import Response, StreamingResponse

from noisescope_server import queries
from noisescope_server.api.deps import EngineDep, ReadScope

router = APIRouter(tags=["query"])


def _json(result: object) -> Response:
    """orjson encodes the query dataclasses directly (2000-point series: a few ms, not tens);
    ``response_model`` still documents the shape in the OpenAPI schema."""
    return Response(orjson.dumps(result), media_type="application/json")


@router.get("/projects", response_model=list[str], summary="Project names")
def get_projects(engine: EngineDep, scope: ReadScope) -> list[str]:
    return queries.list_projects(engine, project_scope=scope)


@router.get("/runs", response_model=list[queries.RunSummary], summary="List and filter runs")
def get_runs(
    engine: EngineDep,
    scope: ReadScope,
    project: str | None = None,
    task: str | None = None,
    tag: str | None = None,
    status: str | None = None,
    search: str | None = None,
    started_after: datetime | None = None,
    started_before: datetime | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 200,
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
        )
    )


@router.get("/runs/{run_id}", response_model=queries.RunSummary, summary="One run")
def get_run(run_id: str, engine: EngineDep, scope: ReadScope) -> Response:
    return _json(queries.get_run(engine, run_id, project_scope=scope))


@router.get(
    "/runs/{run_id}/series",
    response_model=queries.RunSeries,
    summary="A run's |G|^2, tr(Sigma), B_simple, loss bucketed server-side to <= max_points",
)
def get_series(
    run_id: str,
    engine: EngineDep,
    scope: ReadScope,
    x: queries.XAxis = "step",
    max_points: Annotated[int, Query(ge=1, le=20_000)] = 2000,
    series: str = "",
    smooth: Annotated[int, Query(ge=1, le=1000, description="trailing buckets summed")] = 1,
) -> Response:
    result = queries.run_series(
        engine, run_id, x=x, max_points=max_points, series=series, project_scope=scope
    )
    if smooth > 1:
        result = queries.RunSeries(
            result.run_uid,
            result.series,
            result.x,
            result.units,
            result.n_samples,
            result.source,
            queries.smooth_series(result.points, smooth),
        )
    return _json(result)


@router.get(
    "/runs/{run_id}/series-names",
    response_model=list[queries.SeriesInfo],
    summary="Series of a run",
)
def get_series_names(run_id: str, engine: EngineDep, scope: ReadScope) -> Response:
    return _json(queries.series_names(engine, run_id, project_scope=scope))


@router.get(
    "/runs/{run_id}/events", response_model=list[queries.EventRow], summary="Events of a run"
)
def get_events(run_id: str, engine: EngineDep, scope: ReadScope) -> Response:
    return _json(queries.run_events(engine, run_id, project_scope=scope))


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


@router.get("/tasks", response_model=list[queries.TaskSummary], summary="Tasks across runs")
def get_tasks(engine: EngineDep, scope: ReadScope, project: str | None = None) -> Response:
    return _json(queries.task_summaries(engine, project, project_scope=scope))


@router.get(
    "/tasks/{task}/crossings",
    response_model=list[queries.RunCrossings],
    summary="Per run of a task: first step/examples where the loss reached each target",
)
def get_crossings(
    task: str,
    engine: EngineDep,
    scope: ReadScope,
    targets: Annotated[list[float], Query(min_length=1, max_length=100)],
    project: str | None = None,
) -> Response:
    if any(t != t or t in (float("inf"), float("-inf")) for t in targets):
        raise HTTPException(422, "targets must be finite numbers")
    return _json(
        queries.loss_target_crossings(engine, task, targets, project=project, project_scope=scope)
    )
