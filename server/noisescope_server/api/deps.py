"""FastAPI dependencies: the engine and settings of this app, and who the caller is.

They are ``async def`` because FastAPI runs a plain ``def`` dependency in its thread pool: a
thread hop (a few hundred microseconds of CPU) for each of these lookups on every request.
The one that may block, the token lookup, hands only its database query to the pool.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from sqlalchemy import Engine
from starlette.concurrency import run_in_threadpool

from noisescope_server.auth import resolve_token
from noisescope_server.errors import Forbidden
from noisescope_server.settings import Settings
from noisescope_server.tokens import SCOPES, TokenRow

__all__ = [
    "AdminDep",
    "Caller",
    "CallerDep",
    "EngineDep",
    "ManageScope",
    "ReadScope",
    "SettingsDep",
    "TokenDep",
    "WriteScope",
    "missing_scope",
]


async def get_engine(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


EngineDep = Annotated[Engine, Depends(get_engine)]
SettingsDep = Annotated[Settings, Depends(get_settings)]

_HOW = (
    "create one with `noisescope token create --project NAME` "
    "and send `Authorization: Bearer <token>`"
)


def missing_scope(token: TokenRow, scope: str) -> str:
    """The 403's message for a token without ``scope``: what it has, what the scope is for,
    and the command that makes a token with it."""
    has = ", ".join(s for s in SCOPES if s in token.scopes) or "none"
    return (
        f"this token ({token.name!r}, scopes: {has}) lacks the {scope!r} scope, which is "
        f"needed to {SCOPES[scope]}: create a token with it on the server machine with "
        f"`noisescope token create --project {token.project} --scope {scope}` "
        "(or ask whoever runs the server) and send it as `Authorization: Bearer <token>`"
    )


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if header is None:
        return None
    scheme, _, secret = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise HTTPException(
            401, "Authorization header must be 'Bearer <token>'", {"WWW-Authenticate": "Bearer"}
        )
    return secret.strip()


async def get_token(request: Request, engine: EngineDep, settings: SettingsDep) -> TokenRow | None:
    """The caller's token (None when none was sent, or when auth is off)."""
    if settings.auth == "off":
        return None
    secret = _bearer(request)
    if secret is None:
        return None
    token = await run_in_threadpool(resolve_token, engine, secret)
    if token is None:
        raise HTTPException(401, "invalid or revoked token", {"WWW-Authenticate": "Bearer"})
    return token


TokenDep = Annotated[TokenRow | None, Depends(get_token)]


@dataclass(frozen=True)
class Caller:
    """Who writes: the project a write is restricted to (None: any, auth off) and the token
    (None: auth off), for the routes whose scope depends on the body (PATCH)."""

    project_id: int | None
    token: TokenRow | None

    def need(self, scope: str) -> None:
        """Forbidden (403) naming the scope and how to get it, unless the token holds it."""
        if self.token is not None and scope not in self.token.scopes:
            raise Forbidden(missing_scope(self.token, scope))


async def writer(token: TokenDep, settings: SettingsDep) -> Caller:
    """The caller of a write (any scope): a token is required unless auth is off."""
    if settings.auth == "off":
        return Caller(None, None)
    if token is None:
        raise HTTPException(
            401,
            f"this server needs a project token to write: {_HOW}",
            {"WWW-Authenticate": "Bearer"},
        )
    return Caller(token.project_id, token)


CallerDep = Annotated[Caller, Depends(writer)]


async def write_scope(caller: CallerDep) -> int | None:
    """The project id an ingest is restricted to (None: unrestricted, auth off); the token
    needs the ``write`` scope."""
    caller.need("write")
    return caller.project_id


async def manage_scope(caller: CallerDep) -> int | None:
    """The project id a change by hand (delete) is restricted to; needs ``manage``."""
    caller.need("manage")
    return caller.project_id


async def read_scope(token: TokenDep, settings: SettingsDep) -> int | None:
    """The project id a read is restricted to: a token always scopes, and needs ``read``; no
    token is fine unless ``NOISESCOPE_AUTH=all``."""
    if token is not None:
        Caller(token.project_id, token).need("read")
        return token.project_id
    if settings.auth == "all":
        raise HTTPException(
            401,
            f"this server needs a project token to read: {_HOW}",
            {"WWW-Authenticate": "Bearer"},
        )
    return None


WriteScope = Annotated[int | None, Depends(write_scope)]
ManageScope = Annotated[int | None, Depends(manage_scope)]
ReadScope = Annotated[int | None, Depends(read_scope)]


@dataclass(frozen=True)
class Admin:
    pass


async def require_admin(request: Request, settings: SettingsDep) -> Admin:
    """Token management over HTTP: needs NOISESCOPE_ADMIN_TOKEN when auth is on."""
    if settings.auth == "off" and not settings.admin_token:
        return Admin()
    if not settings.admin_token:
        raise HTTPException(
            403,
            "token management over HTTP is disabled: set NOISESCOPE_ADMIN_TOKEN on the server, "
            "or use `noisescope token create|list|revoke` on the server machine",
        )
    import hmac

    secret = _bearer(request)
    if secret is None or not hmac.compare_digest(secret, settings.admin_token):
        raise HTTPException(
            401, "this endpoint needs the admin token", {"WWW-Authenticate": "Bearer"}
        )
    return Admin()


AdminDep = Annotated[Admin, Depends(require_admin)]
