"""Run ids in URLs: every path under ``/api/v1/runs/<id>`` and every ``?runs=`` list is checked
against the one rule (``noisescope.protocol.run_id_problem``) before routing.

Before routing, because the router sees the percent-decoded path: ``..%2Fx`` would otherwise
reach no route (a bare 404 that does not say why) and ``%2e%2e`` would be looked up as the run
``..``. The segment is decoded here from the raw path, so every spelling of a hostile id gets
the same 422 naming the rule, on reads as on writes.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import unquote

import orjson
from fastapi import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from noisescope import protocol

__all__ = ["RunIdGuard", "check_run_ids"]

_RUNS = f"{protocol.API_PREFIX}/runs/".encode()


def check_run_ids(run_ids: Iterable[str]) -> None:
    """422 naming the rule for the first invalid id of a ``?runs=`` list."""
    for run_id in run_ids:
        problem = protocol.run_id_problem(run_id)
        if problem is not None:
            raise HTTPException(422, f"query parameter runs: {problem}")


def _path_problem(method: str, raw_path: bytes) -> str | None:
    if not raw_path.startswith(_RUNS):
        return None
    rest = raw_path[len(_RUNS) :]
    if not rest and method in ("GET", "HEAD"):
        return None  # "/runs/" is the run list with a trailing slash
    segment = rest.split(b"/", 1)[0]
    return protocol.run_id_problem(unquote(segment.decode("latin-1"), errors="replace"))


class RunIdGuard:
    """Pure ASGI (no per-request task or body wrapping: ingest is the hot path)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            raw = scope.get("raw_path") or scope["path"].encode()
            problem = _path_problem(scope["method"], raw.split(b"?", 1)[0])
            if problem is not None:
                body = orjson.dumps({"detail": problem})
                await send(
                    {
                        "type": "http.response.start",
                        "status": 422,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)
