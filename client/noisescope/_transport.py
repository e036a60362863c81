"""The one I/O seam of the client, in the style of httpx's transports.

Everything above this module (sender, sync) builds ``Request`` objects and reads ``Response``
objects; only a ``Transport`` touches the network. Tests pass an in-process transport (or a
real ``HTTPTransport`` pointed at a fault-injecting proxy) without patching anything.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Request:
    method: str
    #: Path under the server root, e.g. ``/api/v1/runs/<id>/samples``.
    path: str
    body: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


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
        except ValueError:
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


@runtime_checkable
class Transport(Protocol):
    def handle_request(self, request: Request) -> Response:
        """Send one request; return any HTTP answer; raise ``TransportError`` if none came."""
        ...

    def close(self) -> None: ...


class HTTPTransport:
    """``requests.Session`` (keep-alive connection pool) against one server base URL."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 10.0) -> None:
        import requests  # deferred: keeps `import noisescope` cheap

        self._requests = requests
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._session = requests.Session()
        self._session.headers["User-Agent"] = "noisescope-client"
        if token:
            self._session.headers["Authorization"] = f"Bearer {token}"

    def handle_request(self, request: Request) -> Response:
        try:
            answer = self._session.request(
                request.method,
                self.url + request.path,
                data=request.body,
                headers=dict(request.headers),
                timeout=self.timeout,
            )
        except self._requests.RequestException as exc:
            reason = str(exc.__context__ or exc).split(": ")[-1].rstrip("\"')")[:160]
            raise TransportError(f"{type(exc).__name__} to {self.url}: {reason}") from exc
        return Response(answer.status_code, answer.content, dict(answer.headers))

    def close(self) -> None:
        self._session.close()
