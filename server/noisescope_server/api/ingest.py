"""Write endpoints for measurements: samples (columnar, bulk) and events."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import APIRouter, HTTPException, Request, Response
from starlette.concurrency import run_in_threadpool

from noisescope_server import crud
from noisescope_server.api._body import json_body, openapi_body, parse_model, read_body
from noisescope_server.api._write import write_to_run
from noisescope_server.api.deps import EngineDep, SettingsDep, WriteScope
from noisescope_server.api.schemas import SAMPLES_BODY_SCHEMA, EventsBody, IngestResult

router = APIRouter(tags=["ingest"])
_Route = TypeVar("_Route", bound=Callable[..., Awaitable[Any]])

_ERRORS = {
    400: {"description": "malformed JSON or gzip"},
    401: {"description": "missing or invalid token (auth on)"},
    403: {"description": "token of another project"},
    404: {"description": "unknown run: PUT it first"},
    413: {"description": "body or batch larger than the limit"},
    422: {"description": "invalid values; `detail` names the column and index"},
}


def _ingest_route(what: str, body: Any, summary: str) -> Callable[[_Route], _Route]:
    """``POST /runs/{run_id}/<what>`` of a ``body``: every ingest answers an ``IngestResult``
    and documents the same errors."""
    return router.post(
        f"/runs/{{run_id}}/{what}",
        response_model=IngestResult,
        openapi_extra=openapi_body(body),
        responses=_ERRORS,  # type: ignore[arg-type]
        summary=summary,
    )


@_ingest_route(
    "samples",
    SAMPLES_BODY_SCHEMA,
    "Add gradient-noise samples to a run (columnar, idempotent on seq)",
)
async def post_samples(
    run_id: str, request: Request, engine: EngineDep, settings: SettingsDep, scope: WriteScope
) -> IngestResult:
    def ingest(raw: bytes) -> IngestResult:
        batch = crud.validate_samples(json_body(raw), max_samples=settings.max_samples)
        inserted = crud.ingest_samples(engine, run_id, batch, project_scope=scope)
        return IngestResult(received=batch.n, inserted=inserted)

    return await write_to_run(request, settings, ingest)


@_ingest_route("events", EventsBody, "Add events (batch-size changes, marks) to a run")
async def post_events(
    run_id: str, request: Request, engine: EngineDep, settings: SettingsDep, scope: WriteScope
) -> IngestResult:
    def ingest(raw: bytes) -> IngestResult:
        events = [crud.EventIn(**e.model_dump()) for e in parse_model(EventsBody, raw).events]
        inserted = crud.ingest_events(engine, run_id, events, project_scope=scope)
        return IngestResult(received=len(events), inserted=inserted)

    return await write_to_run(request, settings, ingest)


@router.post(
    "/runs/{run_id}/heartbeat",
    status_code=204,
    response_class=Response,
    responses={k: v for k, v in _ERRORS.items() if k in (401, 403, 404)},
    summary="Say the run's process is alive (empty body); a running run silent for the "
    "server's crash_after reads as crashed",
)
async def post_heartbeat(
    run_id: str, request: Request, engine: EngineDep, settings: SettingsDep, scope: WriteScope
) -> Response:
    if (await read_body(request, 1024)).strip() not in (b"", b"{}"):
        raise HTTPException(422, "a heartbeat has no body: send an empty POST")
    await run_in_threadpool(crud.touch_run, engine, run_id, project_scope=scope)
    return Response(status_code=204)
