"""Run lifecycle: create/update (PUT, idempotent by client-generated id), status, name, tags
and archiving (PATCH), and deletion (DELETE: the run and every row of it, for good; its id
stays deleted: writes to it answer 410 until a PUT with ``?reuse_deleted=true``).

Scopes: PUT and a PATCH of status, end time or batch size need ``write`` (what a job does);
a PATCH of name, tags or archived, DELETE, and reusing a deleted id need ``manage``.

Both answers carry the run's dashboard link when the server knows its dashboard
(``NOISESCOPE_DASHBOARD_URL``): the client prints it, so a job's log says where to look.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from noisescope_server import crud
from noisescope_server.api._body import openapi_body, parse_model
from noisescope_server.api._write import write_to_run
from noisescope_server.api.deps import CallerDep, EngineDep, ManageScope, SettingsDep
from noisescope_server.api.schemas import RunPatch, RunPut, RunPutResult
from noisescope_server.settings import Settings

router = APIRouter(tags=["runs"])


def _answer(settings: Settings, ref: crud.RunRef, *, created: bool) -> RunPutResult:
    return RunPutResult(
        run_id=ref.uid,
        project=ref.project,
        created=created,
        dashboard_url=settings.run_page_url(ref.uid),
        warnings=list(ref.notes),
    )


@router.put(
    "/runs/{run_id}",
    response_model=RunPutResult,
    openapi_extra=openapi_body(RunPut),
    summary="Create or update a run (201 when created)",
    responses={
        403: {"description": "the token lacks the scope (write; manage to reuse a deleted id)"},
        409: {"description": "the run belongs to another project"},
        410: {"description": "the run was deleted: reuse its id with ?reuse_deleted=true"},
    },
)
async def put_run(
    run_id: str,
    request: Request,
    response: Response,
    engine: EngineDep,
    settings: SettingsDep,
    caller: CallerDep,
    reuse_deleted: Annotated[
        bool,
        Query(description="create the run afresh under the id of a deleted run (scope manage)"),
    ] = False,
) -> RunPutResult:
    caller.need("write")
    if reuse_deleted:
        caller.need("manage")

    def put(raw: bytes) -> RunPutResult:
        body = parse_model(RunPut, raw)
        # the body field for field, but the parent's name: its column holds the parent's uid
        run = crud.RunIn(
            **body.model_dump(exclude={"parent_run_id"}), parent_uid=body.parent_run_id
        )
        ref, created = crud.upsert_run(
            engine, run_id, run, project_scope=caller.project_id, reuse_deleted=reuse_deleted
        )
        return _answer(settings, ref, created=created)

    result = await write_to_run(request, settings, put)
    response.status_code = 201 if result.created else 200
    return result


# PUT and PATCH look alike (a body parsed in the run's write path, an answer from ``_answer``)
# but are two routes: each has its own body model, scopes and documented refusals, which
# FastAPI reads from the route's own signature and decorator (see the note in api/query.py).
@router.patch(
    "/runs/{run_id}",
    response_model=RunPutResult,
    openapi_extra=openapi_body(RunPatch),
    summary="Update a run's status, end time, name or tags, or archive / restore it",
    responses={
        403: {"description": "another project's run, or the token lacks the scope"},
        410: {"description": "the run was deleted"},
    },
)
async def patch_run(
    run_id: str, request: Request, engine: EngineDep, settings: SettingsDep, caller: CallerDep
) -> RunPutResult:
    def patch(raw: bytes) -> RunPutResult:
        body = parse_model(RunPatch, raw)
        fields = body.model_dump()
        if any(fields[name] is not None for name in ("status", "ended_at", "batch_size")):
            caller.need("write")  # what the run's job sets
        if any(fields[name] is not None for name in ("name", "tags", "archived")):
            caller.need("manage")  # what people set
        ref = crud.patch_run(engine, run_id, **fields, project_scope=caller.project_id)
        return _answer(settings, ref, created=False)

    return await write_to_run(request, settings, patch)


@router.delete(
    "/runs/{run_id}",
    status_code=204,
    response_class=Response,
    summary="Delete a run: its samples, sample blocks, events and the run itself (for good)",
    responses={
        403: {"description": "another project's run, or the token lacks the manage scope"},
        404: {"description": "no such run"},
    },
)
async def delete_run(run_id: str, engine: EngineDep, scope: ManageScope) -> Response:
    await run_in_threadpool(crud.delete_run, engine, run_id, project_scope=scope)
    return Response(status_code=204)
