"""Reads for branching and forecasting: a run's branch points (``branches``) and the law
B_crit(L) = B*·L^(-1/α_B) across a task's sweep targets (``noisescope.forecast``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from noisescope.forecast import ForecastReport, forecast_report
from noisescope.protocol import RunBranches
from noisescope_server import branches, sweeps
from noisescope_server.api.deps import EngineDep, ReadScope
from noisescope_server.api.query import _json, _loss_targets, _task_path
from noisescope_server.errors import value_errors_as_bad_input

router = APIRouter(tags=["query"])
# One function per route, though they look alike: see the note in api/query.py.


@router.get(
    "/runs/{run_id}/branches",
    response_model=RunBranches,
    summary="The local critical batch size at each branch step of a run, from its branch runs",
)
def get_branches(run_id: str, engine: EngineDep, scope: ReadScope) -> Response:
    return _json(branches.run_branches(engine, run_id, project_scope=scope))


@router.get(
    "/tasks/{project}/{task:path}/critical-batch/forecast",
    response_model=ForecastReport,
    summary="B_crit(L) = B*·L^(-1/alpha_B) across the sweep's targets, predicted at given losses",
)
def get_forecast(
    project: str,
    task: str,
    request: Request,
    engine: EngineDep,
    scope: ReadScope,
    loss: Annotated[
        list[float] | None,
        Query(max_length=50, description="losses to predict B_crit at (may be unreached)"),
    ] = None,
    targets: Annotated[
        list[float] | None,
        Query(max_length=50, description="sweep loss targets (default: the sweep's defaults)"),
    ] = None,
) -> Response:
    chosen = _loss_targets(targets)
    project, task = _task_path(request, project, task, suffix="critical-batch/forecast")
    report = sweeps.critical_batch(engine, project, task, targets=chosen, project_scope=scope)
    # forecast_report checks the losses, and names the range it can read when one is too far
    with value_errors_as_bad_input():
        forecast = forecast_report(report, loss or [])
    return _json(forecast)
