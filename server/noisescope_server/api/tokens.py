"""Token introspection and (admin-only) token management over HTTP.

The usual way to manage tokens is the CLI on the server machine (``noisescope token``); these
endpoints exist for deployments where that is inconvenient and need NOISESCOPE_ADMIN_TOKEN.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Request
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from noisescope_server import crud
from noisescope_server.api._body import openapi_body, parse_model, read_body
from noisescope_server.api.deps import AdminDep, EngineDep, SettingsDep, TokenDep
from noisescope_server.api.schemas import TokenCreate
from noisescope_server.tokens import SCOPES, TokenRow, list_tokens, parse_scopes

router = APIRouter(tags=["tokens"])


class WhoAmI(BaseModel):
    project: str | None
    token_name: str | None
    auth: str
    #: What the caller may do: the token's scopes; with no token, what the server's auth mode
    #: leaves open to anyone (``off``: everything, ``write``: read, ``all``: nothing).
    scopes: list[str]


class TokenCreated(BaseModel):
    id: int
    project: str
    name: str
    scopes: list[str]
    token: str


class TokenOut(BaseModel):
    id: int
    project: str
    name: str
    scopes: list[str]
    created_at: datetime
    revoked_at: datetime | None


#: What a caller without a token may do in each auth mode.
_OPEN_SCOPES = {"off": list(SCOPES), "write": ["read"], "all": []}


@router.get("/auth/whoami", response_model=WhoAmI, summary="Which project the token grants")
def whoami(token: TokenDep, settings: SettingsDep) -> WhoAmI:
    return WhoAmI(
        project=None if token is None else token.project,
        token_name=None if token is None else token.name,
        auth=settings.auth,
        scopes=_OPEN_SCOPES[settings.auth]
        if token is None
        else [s for s in SCOPES if s in token.scopes],
    )


@router.post(
    "/projects/{project}/tokens",
    response_model=TokenCreated,
    status_code=201,
    openapi_extra=openapi_body(TokenCreate),
    summary="Create a project token (admin); the secret is shown only in this response",
)
async def create_token(
    project: str, request: Request, engine: EngineDep, settings: SettingsDep, _admin: AdminDep
) -> TokenCreated:
    raw = await read_body(request, 64 * 1024)
    body = parse_model(TokenCreate, raw) if raw else TokenCreate()
    scopes = parse_scopes(body.scopes)
    created = await run_in_threadpool(crud.create_token, engine, project, body.name, scopes)
    return TokenCreated(
        id=created.id,
        project=created.project,
        name=created.name,
        scopes=list(created.scopes),
        token=created.secret,
    )


@router.get(
    "/projects/{project}/tokens", response_model=list[TokenOut], summary="List tokens (admin)"
)
def get_tokens(project: str, engine: EngineDep, _admin: AdminDep) -> list[TokenOut]:
    return [_out(t) for t in list_tokens(engine, project)]


def _out(t: TokenRow) -> TokenOut:
    return TokenOut(
        id=t.id,
        project=t.project,
        name=t.name,
        scopes=[s for s in SCOPES if s in t.scopes],
        created_at=t.created_at,
        revoked_at=t.revoked_at,
    )


@router.delete("/tokens/{token_id}", status_code=204, summary="Revoke a token (admin)")
def delete_token(
    token_id: Annotated[int, Path(ge=1, le=2**63 - 1)], engine: EngineDep, _admin: AdminDep
) -> None:
    if not crud.revoke_token(engine, token_id):
        raise HTTPException(404, f"no live token with id {token_id}")
