"""The one way a route writes to a run: the body within the size limit, the database work off
the event loop. The run id in the URL is checked before routing (``run_ids.RunIdGuard``), so
no byte of a body is read for an invalid one."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from noisescope_server.api._body import read_body
from noisescope_server.settings import Settings

__all__ = ["write_to_run"]

T = TypeVar("T")


async def write_to_run(request: Request, settings: Settings, write: Callable[[bytes], T]) -> T:
    """``write(body)``'s answer, run in the thread pool (it blocks on the database)."""
    raw = await read_body(request, settings.max_body_bytes)
    return await run_in_threadpool(write, raw)
