"""The noisescope app in the test's own process, for tests of what the server answers.

``AppServer`` builds the app the way ``python -m noisescope_server`` does (``create_app`` on
``Settings.from_env``: the database URL, the auth mode and any ``NOISESCOPE_*`` variable in
``env``; migrations at start) and calls it through ASGI, with no socket and no subprocess: it
starts in a fraction of a second where ``ServerProcess`` takes seconds (a Python process
importing FastAPI, SQLAlchemy and the app). Three ways in, all on one event loop:

- ``client()``: Starlette's ``TestClient`` on the app (httpx's API: an ``httpx.Client``, or
  ``httpx2.Client`` where that package is installed; ``harness/http_clients.py`` names
  both), for tests that speak HTTP; it follows no redirects and turns a server bug into a 500,
  as ``httpx.Client(base_url=server.url)`` against the process does;
- ``transport()``: a ``noisescope.Transport`` (``ASGITransport``) for ``noisescope.init(...,
  transport=)``, ``noisescope.Api(..., transport=)`` and ``sync``: the client's one I/O seam;
- ``api()``: ``noisescope.Api`` on that transport.

``url`` is a loopback URL on the discard port (9) that nothing listens on: the runs' links and
messages name it, and a request that bypasses the transport fails at once instead of reaching
some other server. ``log()`` holds what the server would have logged at warning level, and the
traceback of every exception that reached ASGI (a process logs those as "Exception in ASGI
application"), so "no traceback in the server log" means the same here.

Use ``ServerProcess`` (``harness/servers.py``) instead for anything about the process or
the wire: kills and restarts, several workers, PostgreSQL outages, raw sockets and broken
bodies, timeouts, the CLI, the dashboard and the browser.
"""

from __future__ import annotations

import contextlib
import gc
import io
import logging
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient
from starlette.types import ASGIApp, Receive, Scope, Send

from noisescope import Api, protocol
from noisescope._transport import Request, Response
from noisescope_server.app import create_app
from noisescope_server.settings import Settings

__all__ = ["ASGITransport", "AppServer"]

#: The URL an ``AppServer`` goes by: loopback (so the client does not gzip, as with a local
#: process) on the discard port, where no server listens.
URL = "http://127.0.0.1:9"
#: The loggers whose warnings a server process writes to its log (``--log-level warning``).
LOGGERS = ("noisescope_server", "uvicorn.error")


class _LogExceptions:
    """ASGI middleware: an exception that leaves the app is logged with its traceback, as
    uvicorn logs it, then raised on (the test client answers it 500)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.app(scope, receive, send)
        except Exception:
            logging.getLogger("uvicorn.error").exception("Exception in ASGI application\n")
            raise


class ASGITransport:
    """A ``noisescope.Transport`` that hands each ``Request`` to an ``AppServer``'s app.

    Safe to call from any thread (the client's sender thread, a test): each request runs on
    the server's one event loop. ``Request.deadline_s`` is not enforced (nothing can hang in
    between); ``max_answer_bytes`` is left to the caller's own check on the whole body."""

    def __init__(self, client: TestClient, token: str | None = None) -> None:
        self._client = client
        self._headers = {"User-Agent": "noisescope-client"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"

    def handle_request(self, request: Request) -> Response:
        answer = self._client.request(
            request.method,
            request.path,
            content=request.body,
            headers={**self._headers, **request.headers},
        )
        return Response(answer.status_code, answer.content, dict(answer.headers))

    def close(self) -> None:
        """Nothing to let go: the client is the server's, closed with it (so several runs,
        each closing its transport when it finishes, may share one)."""


class AppServer:
    """The app of ``ServerProcess(database_url, auth=auth, env=env)``, in this process.

    ``database_url`` defaults to a SQLite file in a fresh temporary directory (also the
    server's ``NOISESCOPE_HOME``). Start with ``start()`` or ``with``; ``close()`` ends the
    app's lifespan (the engine is disposed) and removes the directory."""

    def __init__(
        self,
        database_url: str | None = None,
        auth: str = "off",
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="noisescope-app-")
        self.database_url = database_url or f"sqlite:///{Path(self._tmp.name) / 'noisescope.db'}"
        self.auth = auth
        self.env = dict(env or {})
        self.url = URL
        self.settings = Settings.from_env(
            {"NOISESCOPE_HOME": self._tmp.name, **self.env},
            database_url=self.database_url,
            auth=auth,
        )
        self._log = io.StringIO()
        self._handler = logging.StreamHandler(self._log)
        self._handler.setLevel(logging.WARNING)
        self._handler.setFormatter(logging.Formatter("%(levelname)s: %(name)s: %(message)s"))
        self._lock = threading.Lock()
        self._main: TestClient | None = None
        self._clients: list[TestClient] = []
        self._gc_threshold = gc.get_threshold()

    def start(self) -> AppServer:
        if self._main is not None:
            raise RuntimeError("the app is already started")
        for name in LOGGERS:
            logging.getLogger(name).addHandler(self._handler)
        self._main = self._test_client()
        self._main.__enter__()  # the lifespan: engine, migrations
        return self

    def _test_client(self) -> TestClient:
        app = create_app(self.settings)
        return TestClient(
            _LogExceptions(app),
            base_url=self.url,
            raise_server_exceptions=False,
            follow_redirects=False,
            client=("127.0.0.1", 50000),
        )

    @property
    def app(self) -> Any:
        """The FastAPI app (its ``state.engine`` is the server's engine)."""
        assert self._main is not None, "start the AppServer first"
        return self._main.app.app  # type: ignore[attr-defined]

    def client(self, token: str | None = None, prefix: str = "", **kwargs: Any) -> TestClient:
        """A ``TestClient`` on the app (``base_url`` is ``url + prefix``); ``token``: a
        bearer token on every request. Closed with the server, or by the caller."""
        main = self._main
        assert main is not None and main.portal is not None, "start the AppServer first"
        headers = dict(kwargs.pop("headers", {}) or {})
        if token:
            headers["Authorization"] = f"Bearer {token}"
        client = TestClient(
            main.app,
            base_url=self.url + prefix,
            raise_server_exceptions=False,
            follow_redirects=bool(kwargs.pop("follow_redirects", False)),
            client=("127.0.0.1", 50000),
            headers=headers,
        )
        kwargs.pop("timeout", None)  # nothing to wait for in-process
        if kwargs:
            raise TypeError(f"unexpected arguments: {sorted(kwargs)}")
        client.portal = main.portal  # this server's event loop, not one per request
        with self._lock:
            self._clients.append(client)
        return client

    def make_token(
        self, project: str, admin_token: str, scopes: tuple[str, ...] = ("read", "write")
    ) -> dict[str, Any]:
        """A new token of ``project`` with ``scopes`` (``POST /projects/{project}/tokens`` as
        the admin): the answer, with its ``token`` and ``id``."""
        with self.client() as http:
            made = http.post(
                f"{protocol.API_PREFIX}/projects/{project}/tokens",
                json={"name": "ci", "scopes": list(scopes)},
                headers={"Authorization": f"Bearer {admin_token}"},
            )
        assert made.status_code == 201, made.text
        answer: dict[str, Any] = made.json()
        return answer

    def transport(self, token: str | None = None) -> ASGITransport:
        """A ``noisescope.Transport`` on the app, with ``token`` as its bearer token."""
        return ASGITransport(self.client(), token)

    def api(self, token: str | None = None, **kwargs: Any) -> Api:
        """``noisescope.Api`` on the app."""
        return Api(self.url, transport=self.transport(token), **kwargs)

    @property
    def engine(self) -> Any:
        """The server's own SQLAlchemy engine."""
        return self.app.state.engine

    def log(self) -> str:
        return self._log.getvalue()

    def close(self) -> None:
        main, self._main = self._main, None
        with self._lock:
            clients, self._clients = self._clients, []
        for client in clients:
            client.portal = None
            client.close()
        try:
            if main is not None:
                main.__exit__(None, None, None)
        finally:
            for name in LOGGERS:
                logging.getLogger(name).removeHandler(self._handler)
            # the app's start froze the heap and slowed the cyclic GC (app.py, for a server
            # process): give this test process its own settings back
            gc.unfreeze()
            gc.set_threshold(*self._gc_threshold)
            with contextlib.suppress(OSError):
                self._tmp.cleanup()

    def __enter__(self) -> AppServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()
