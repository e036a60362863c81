"""An in-process transport that behaves like the ingest server (insert-or-ignore on (run, seq)).

Unit tests use it to drive batching, backoff and spool logic without sockets; fault tests with
the real server live in test_faults.py.
"""

from __future__ import annotations

import gzip
import json
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from noisescope import Request, Response, TransportError, _wire

#: A scripted answer: an HTTP status (with optional headers), or an exception to raise.
Fault = int | tuple[int, dict[str, str]] | Exception


class FakeServer:
    """Thread-safe fake of the HTTP API; ``faults`` are consumed one per request first."""

    def __init__(self, *, down: bool = False) -> None:
        self.lock = threading.Lock()
        self.runs: dict[str, dict[str, Any]] = {}
        self.samples: dict[str, dict[int, dict[str, Any]]] = {}
        self.events: dict[str, dict[int, dict[str, Any]]] = {}
        self.faults: list[Fault] = []
        #: While True every request raises TransportError (server unreachable).
        self.down = down
        self.delay = 0.0
        self.requests: list[tuple[float, Request]] = []
        self.batch_sizes: list[int] = []
        self.on_request: Callable[[Request], None] | None = None
        self.closed = False
        #: Answer run creations with this ``dashboard_url`` (the server's run link), if set.
        self.dashboard_url: str | None = None

    # -- Transport protocol --------------------------------------------------------------
    def handle_request(self, request: Request) -> Response:
        with self.lock:
            self.requests.append((time.monotonic(), request))
            fault = self.faults.pop(0) if self.faults else None
            down = self.down
        if self.on_request is not None:
            self.on_request(request)
        if self.delay:
            time.sleep(self.delay)
        if down:
            raise TransportError("connection refused (fake)")
        if isinstance(fault, Exception):
            raise fault
        if fault is not None:
            status, headers = fault if isinstance(fault, tuple) else (fault, {})
            return Response(status, json.dumps({"detail": f"fault {status}"}).encode(), headers)
        return self._serve(request)

    def close(self) -> None:
        self.closed = True

    # -- the API -------------------------------------------------------------------------
    def _serve(self, request: Request) -> Response:
        body = request.body or b""
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        payload = json.loads(body) if body else {}
        match = re.fullmatch(
            rf"/api/v1/runs/({_wire.RUN_ID_PATTERN})(/samples|/events)?", request.path
        )
        if match is None:
            return Response(404, b'{"detail": "no such route"}')
        run_id, samples = match.group(1), match.group(2)
        with self.lock:
            if request.method == "PUT" and not samples:
                self.runs.setdefault(run_id, {}).update(payload)
                self.samples.setdefault(run_id, {})
                answer = {"dashboard_url": self.dashboard_url} if self.dashboard_url else {}
                return Response(200, json.dumps(answer).encode())
            if run_id not in self.runs:
                return Response(404, b'{"detail": "unknown run"}')
            if request.method == "PATCH":
                self.runs[run_id].update(payload)
                return Response(200, b"{}")
            if samples == "/events":
                for event in payload["events"]:
                    self.events.setdefault(run_id, {})[event["seq"]] = event
                return Response(200, b"{}")
            columns = payload["columns"]
            n = len(columns["seq"])
            self.batch_sizes.append(n)
            stored = self.samples[run_id]
            inserted = 0
            for i in range(n):
                row = {name: values[i] for name, values in columns.items()}
                if row["seq"] not in stored:
                    stored[row["seq"]] = row
                    inserted += 1
            return Response(200, json.dumps({"received": n, "inserted": inserted}).encode())

    # -- helpers for assertions -----------------------------------------------------------
    def rows(self, run_id: str) -> list[dict[str, Any]]:
        with self.lock:
            return [self.samples.get(run_id, {})[k] for k in sorted(self.samples.get(run_id, {}))]

    def sample_posts(self) -> list[Request]:
        with self.lock:
            return [r for _, r in self.requests if r.path.endswith("/samples")]


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll until ``predicate()``; a generous deadline, so tests never race the sender."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()
