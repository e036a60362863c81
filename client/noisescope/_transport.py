"""The one I/O seam of the client, in the style of httpx's transports.

Everything above this module (sender, sync) builds ``Request`` objects and reads ``Response``
objects; only a ``Transport`` touches the network. Tests pass an in-process transport (or a
real ``HTTPTransport`` pointed at a fault-injecting proxy) without patching anything.

A ``Request`` may carry a deadline for the whole exchange and a cap on the answer's decoded
size (the read client sets both): ``HTTPTransport`` cuts the socket at the deadline, whoever
trickles, and stops reading past the cap, so a decompression bomb is never held whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from noisescope._redact import redact_text, redact_url


@dataclass(frozen=True)
class Request:
    method: str
    #: Path under the server root, e.g. ``/api/v1/runs/<id>/samples``.
    path: str
    body: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    #: Seconds the whole exchange may take (connecting, waiting, every byte of the answer);
    #: None: only the transport's own timeout, which bounds each wait on the socket.
    deadline_s: float | None = None
    #: The most bytes the answer's body may hold once decoded (gzip); None: no limit.
    max_answer_bytes: int | None = None


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    def detail(self) -> str:
        """The server's error message (``{"detail": ...}``), or the raw body, shortened."""
        try:
            payload = self.json()
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
            payload = None
        if isinstance(payload, dict) and "detail" in payload:
            detail = payload["detail"]
            text = detail if isinstance(detail, str) else json.dumps(detail)
        else:
            text = self.body.decode("utf-8", "replace")
        return text[:500]

    def header(self, name: str) -> str | None:
        lowered = name.lower()
        for key, value in self.headers.items():
            if key.lower() == lowered:
                return value
        return None


class TransportError(Exception):
    """The request did not get an HTTP answer (connection refused/reset, timeout, DNS)."""


class DeadlinePassed(TransportError):
    """The whole exchange did not end within ``Request.deadline_s``: it was cut there."""


class AnswerTooLarge(TransportError):
    """The answer's decoded body passed ``Request.max_answer_bytes``: it was not read on."""

    def __init__(self, status: int, limit: int) -> None:
        super().__init__(f"HTTP {status} answer larger than {limit} bytes decoded")
        self.status = status
        self.limit = limit


@runtime_checkable
class Transport(Protocol):
    def handle_request(self, request: Request) -> Response:
        """Send one request; return any HTTP answer; raise ``TransportError`` if none came."""
        ...

    def close(self) -> None: ...


class _Call:
    """One request in flight on a thread: the socket it uses, so that a watchdog can cut it at
    the request's deadline (a socket timeout bounds each wait, not their sum)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sock: socket.socket | None = None
        self.cut = False
        self.done = False

    def hold(self, sock: socket.socket | None) -> None:
        """The request's socket (the answer keeps reading it after its connection lets go)."""
        with self.lock:
            if not self.done:
                self.sock = sock

    def expire(self) -> None:
        """The deadline passed: shut the request's socket, which ends a blocked read."""
        with self.lock:
            if self.done:
                return
            self.cut = True
            sock = self.sock
        if sock is not None:
            with contextlib.suppress(OSError):  # already closed
                sock.shutdown(socket.SHUT_RDWR)

    def finish(self) -> None:
        with self.lock:
            self.done = True
            self.sock = None


#: The request in flight on this thread (``_Call``), for the connection pools below.
_IN_FLIGHT = threading.local()
#: Each urllib3 pool class and its watched subclass.
_WATCHED: dict[type, type] = {}


def _watched(base: type) -> type:
    """``base`` (a urllib3 connection pool class) telling the thread's ``_Call`` the socket
    each request uses (urllib3 picks or opens it inside ``session.request``)."""
    if base in _WATCHED.values():  # a proxy manager is watched again each time it is used
        return base
    if base not in _WATCHED:

        class Pool(base):  # type: ignore[misc]
            def _validate_conn(self, conn: Any) -> None:
                super()._validate_conn(conn)  # HTTPS connects here
                call = getattr(_IN_FLIGHT, "call", None)
                if call is not None:
                    if conn.is_closed:  # connect now (the request would), to know the socket
                        conn.connect()
                    call.hold(conn.sock)

        _WATCHED[base] = Pool
    return _WATCHED[base]


def _watched_adapter() -> Any:
    """A requests adapter whose connection pools, direct or through a proxy, are watched."""
    from requests.adapters import HTTPAdapter

    def watch(manager: Any) -> Any:
        manager.pool_classes_by_scheme = {
            scheme: _watched(cls) for scheme, cls in manager.pool_classes_by_scheme.items()
        }
        return manager

    class Adapter(HTTPAdapter):
        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            super().init_poolmanager(*args, **kwargs)
            watch(self.poolmanager)

        def proxy_manager_for(self, proxy: str, **kwargs: Any) -> Any:
            return watch(super().proxy_manager_for(proxy, **kwargs))

    return Adapter()


class HTTPTransport:
    """``requests.Session`` (keep-alive connection pool) against one server base URL."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 10.0) -> None:
        import requests  # deferred: keeps `import noisescope` cheap

        self._requests = requests
        self.url = url.rstrip("/")
        #: The URL as messages name it: a password in it masked (``noisescope._redact``).
        self.shown_url = redact_url(self.url)
        self.timeout = timeout
        self._session = requests.Session()
        self._session.headers["User-Agent"] = "noisescope-client"
        if token:
            self._session.headers["Authorization"] = f"Bearer {token}"
        self._read_environment_once(token)
        adapter = _watched_adapter()
        self._session.mount("http://", adapter)
        self._session.mount("https://", adapter)

    def _read_environment_once(self, token: str | None) -> None:
        """What requests would read from the environment on every request, read once for
        this server: its proxy (``HTTP_PROXY``/``HTTPS_PROXY``, unless ``NO_PROXY`` names it),
        a CA bundle (``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE``) and, without a token, a
        ``~/.netrc`` login. Scanning every variable for proxies on each POST costs about a
        fifth of a request's CPU; and with a token the bearer header is what is sent (requests
        would let a ``~/.netrc`` entry replace it)."""
        utils = self._requests.utils
        self._session.trust_env = False
        self._session.proxies.update(utils.get_environ_proxies(self.url))
        bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
        if bundle:
            self._session.verify = bundle
        if not token:
            self._session.auth = utils.get_netrc_auth(self.url)

    def handle_request(self, request: Request) -> Response:
        """The answer, read whole unless it passes ``request.max_answer_bytes`` (then
        ``AnswerTooLarge``); ``TransportError`` when none came in time: each wait on the
        socket is bounded by ``timeout``, the whole exchange by ``request.deadline_s``."""
        deadline = None
        timeout = self.timeout
        if request.deadline_s is not None:
            timeout = min(timeout, request.deadline_s)
            deadline = time.monotonic() + request.deadline_s
        call = _Call()
        watchdog = None
        if deadline is not None:
            watchdog = threading.Timer(deadline - time.monotonic(), call.expire)
            watchdog.daemon = True
            watchdog.start()
        _IN_FLIGHT.call = call
        try:
            return self._exchange(request, timeout, deadline, call)
        except (self._requests.RequestException, OSError) as exc:
            if call.cut:
                raise DeadlinePassed(
                    f"no whole answer from {self.shown_url} within {request.deadline_s:.3g} s"
                ) from exc
            reason = str(exc.__context__ or exc).split(": ")[-1].rstrip("\"')")[:160]
            raise TransportError(
                redact_text(f"{type(exc).__name__} to {self.shown_url}: {reason}")
            ) from exc
        finally:
            _IN_FLIGHT.call = None
            call.finish()
            if watchdog is not None:
                watchdog.cancel()

    def _exchange(
        self, request: Request, timeout: float, deadline: float | None, call: _Call
    ) -> Response:
        answer = self._session.request(
            request.method,
            self.url + request.path,
            data=request.body,
            headers=dict(request.headers),
            timeout=timeout,
            stream=True,
        )
        limit = request.max_answer_bytes
        body = bytearray()
        try:
            for chunk in answer.iter_content(chunk_size=1 << 16):
                body += chunk
                if limit is not None and len(body) > limit:
                    raise AnswerTooLarge(answer.status_code, limit)
                if deadline is not None and time.monotonic() > deadline:
                    call.expire()
                    raise OSError("the deadline passed")
        finally:
            answer.close()
        return Response(answer.status_code, bytes(body), dict(answer.headers))

    def close(self) -> None:
        self._session.close()
