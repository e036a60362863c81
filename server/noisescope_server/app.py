"""The FastAPI application factory.

``create_app(settings)`` builds one app around one engine; migrations are applied when it
starts (``db.upgrade`` takes a cross-process lock, so N workers starting together are safe).
``app_from_env`` is the factory uvicorn workers call (``--factory``), reading ``Settings`` from
the environment the parent process exported.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from importlib.resources import files

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from sqlalchemy.exc import DataError, DBAPIError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from noisescope import protocol
from noisescope_server import __version__, db, logs
from noisescope_server.api import branching, health, ingest, query, recommend, runs, tokens
from noisescope_server.api._body import format_validation_error
from noisescope_server.api.run_ids import RunIdGuard
from noisescope_server.compactor import Compactor
from noisescope_server.errors import BadInput, Conflict, Forbidden, Gone, NotFound
from noisescope_server.settings import Settings

__all__ = ["app_from_env", "create_app"]

log = logging.getLogger("noisescope_server")
#: Where uvicorn logs connections (its "Invalid HTTP request received." too): a client's
#: broken or abandoned request is logged there, at info level, beside uvicorn's own lines.
connections_log = logging.getLogger("uvicorn.error")


class _ClientFaultsAtInfo(logging.Filter):
    """uvicorn logs a malformed request (e.g. a broken chunked body) as a warning: the
    client's fault, not the server's, so it is an info line like a disconnect."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and record.msg == "Invalid HTTP request received.":
            record.levelno, record.levelname = logging.INFO, "INFO"
            return connections_log.isEnabledFor(logging.INFO)
        return True


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings.from_env()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = db.make_engine(settings.database_url, connect_wait=db.CONNECT_WAIT)
        if settings.migrate:
            before, after = db.upgrade(engine)
            if before != after:
                log.info("database migrated from %s to %s", before or "empty", after)
        app.state.engine = engine
        # An ingest request allocates ~15 objects per sample (parsed JSON, row tuples); with the
        # default thresholds the cyclic GC then keeps re-scanning the long-lived heap (FastAPI,
        # SQLAlchemy). Freeze what start-up built and collect young objects less often.
        gc.collect()
        gc.freeze()
        gc.set_threshold(50_000, 20, 20)
        compactor = None
        if settings.compact_every > 0:
            compactor = Compactor(
                engine,
                every=settings.compact_every,
                finished_after=settings.compact_finished_after,
                quiet_after=settings.compact_quiet_after,
            )
            compactor.start()
        try:
            yield
        finally:
            if compactor is not None:
                compactor.stop()
            engine.dispose()

    app = FastAPI(
        title="noisescope",
        version=__version__,
        summary="Ingest and query gradient-noise-scale measurements of training runs.",
        lifespan=lifespan,
        openapi_url=f"{protocol.API_PREFIX}/openapi.json",
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    _install_docs_ui(app)
    for module in (health, runs, ingest, query, branching, recommend, tokens):
        app.include_router(
            module.router, prefix=protocol.API_PREFIX, dependencies=[Depends(_no_nul_in_url)]
        )
    app.add_middleware(RunIdGuard)
    if not any(isinstance(f, _ClientFaultsAtInfo) for f in connections_log.filters):
        connections_log.addFilter(_ClientFaultsAtInfo())
    logs.install()  # no token or password from a request's URL in the access log
    _install_error_handlers(app)
    return app


#: Swagger UI's and ReDoc's files, served by the server itself: FastAPI's default pages load them
#: from a CDN, so they are blank without internet and tell third parties who reads the docs.
DOCS_ASSETS = f"{protocol.API_PREFIX}/docs/assets"


def _install_docs_ui(app: FastAPI) -> None:
    """``/api/v1/docs`` (Swagger UI) and ``/api/v1/redoc`` from the files that the
    ``fastapi-offline`` distribution ships (FastAPI's "self-hosting" recipe); URLs under the
    ASGI root path, as FastAPI's own pages, so they also work behind a path-prefix proxy."""
    app.mount(DOCS_ASSETS, StaticFiles(directory=str(files("fastapi_offline") / "static")), "docs")
    openapi = f"{protocol.API_PREFIX}/openapi.json"
    redirect = f"{protocol.API_PREFIX}/docs/oauth2-redirect"

    def root(request: Request) -> str:
        return str(request.scope.get("root_path", "")).rstrip("/")

    @app.get(f"{protocol.API_PREFIX}/docs", include_in_schema=False)
    async def _swagger_ui(request: Request) -> HTMLResponse:
        at = root(request)
        return get_swagger_ui_html(
            openapi_url=at + openapi,
            title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=at + redirect,
            swagger_js_url=f"{at}{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{at}{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{at}{DOCS_ASSETS}/favicon.png",
            # no badge from the public validator (it would be sent the schema's URL)
            swagger_ui_parameters={"validatorUrl": None},
        )

    @app.get(redirect, include_in_schema=False)
    async def _swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get(f"{protocol.API_PREFIX}/redoc", include_in_schema=False)
    async def _redoc(request: Request) -> HTMLResponse:
        at = root(request)
        page = get_redoc_html(
            openapi_url=at + openapi,
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{at}{DOCS_ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{at}{DOCS_ASSETS}/favicon.png",
            with_google_fonts=False,
        )
        # ReDoc draws its maker's logo from the maker's CDN, with no option to turn it off:
        # the browser is told to load images from this server only (the logo hides itself).
        page.headers["Content-Security-Policy"] = "img-src 'self' data:"
        return page


async def _no_nul_in_url(request: Request) -> None:
    """422 for a NUL in the URL: PostgreSQL text cannot hold it, and a streamed answer (CSV)
    that fails after its headers were sent can only drop the connection."""
    if "\x00" in request.url.path:
        raise HTTPException(422, "the URL path must not contain NUL (U+0000) characters")
    for key, value in request.query_params.multi_items():
        if "\x00" in key or "\x00" in value:
            raise HTTPException(
                422, f"query parameter {key[:40]!r} must not contain NUL (U+0000) characters"
            )


def app_from_env() -> FastAPI:
    return create_app(Settings.from_env())


def _detail(status: int, message: str) -> JSONResponse:
    return JSONResponse({"detail": message}, status_code=status)


def _refusal_handler(status: int) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
    """A handler that answers ``status`` with the exception's text as the detail."""

    async def refuse(_r: Request, exc: Exception) -> JSONResponse:
        return _detail(status, str(exc))

    return refuse


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, _exc: ClientDisconnect) -> Response:
        # the client went away (or its body was malformed) before the body was read: nobody
        # is left to answer, and nothing was stored, so this is news, not an error
        peer = request.client.host if request.client else "?"
        connections_log.info("client %s disconnected before sending its whole %s %s body",
                 peer, request.method, request.url.path)  # fmt: skip
        return Response(status_code=400)

    # Bad values are BadInput only: any other ValueError is a server bug and stays a 500.
    @app.exception_handler(BadInput)
    async def _bad_input(_r: Request, exc: BadInput) -> JSONResponse:
        if exc.rows is None:
            return _detail(exc.status_code, str(exc))
        # every refused sample by index, so a client can drop those and resend the rest
        body = {"detail": str(exc), "rows": exc.rows}
        return JSONResponse(body, status_code=exc.status_code)

    # the refusals the reads and writes raise: their status, and their text as the detail
    for refusal, status in ((NotFound, 404), (Gone, 410), (Forbidden, 403), (Conflict, 409)):
        app.add_exception_handler(refusal, _refusal_handler(status))

    @app.exception_handler(RequestValidationError)
    async def _validation(_r: Request, exc: RequestValidationError) -> JSONResponse:
        malformed = any(e.get("type") == "json_invalid" for e in exc.errors())
        return _detail(400 if malformed else 422, format_validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_r: Request, exc: StarletteHTTPException) -> JSONResponse:
        response = _detail(exc.status_code, str(exc.detail))
        if exc.headers:
            response.headers.update(exc.headers)
        return response

    @app.exception_handler(OperationalError)
    async def _db_unavailable(_r: Request, exc: OperationalError) -> JSONResponse:
        log.warning("database error: %s", exc.orig)
        return _detail(503, "the database is unavailable or busy; retry shortly")

    async def _driver_unavailable(_r: Request, exc: Exception) -> JSONResponse:
        # the bulk insert uses the driver's cursor directly, so its errors arrive unwrapped
        log.warning("database error: %s", exc)
        return _detail(503, "the database is unavailable or busy; retry shortly")

    import sqlite3

    import psycopg

    app.add_exception_handler(sqlite3.OperationalError, _driver_unavailable)
    app.add_exception_handler(psycopg.OperationalError, _driver_unavailable)

    async def _bad_value(_r: Request, exc: Exception) -> JSONResponse:
        # a value the database cannot hold or compare (e.g. NUL in a query parameter on
        # PostgreSQL, an integer beyond 64 bits on SQLite): the request's fault, not a 500
        orig = getattr(exc, "orig", None) or exc
        reason = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
        return _detail(422, f"a value in this request cannot be used by the database: {reason}")

    app.add_exception_handler(DataError, _bad_value)
    app.add_exception_handler(psycopg.DataError, _bad_value)
    app.add_exception_handler(OverflowError, _bad_value)

    @app.exception_handler(DBAPIError)
    async def _db_error(_r: Request, exc: DBAPIError) -> JSONResponse:
        log.error("database rejected a request: %s", exc.orig)
        return _detail(500, "the database rejected the request")
