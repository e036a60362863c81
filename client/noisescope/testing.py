"""Test your training code against noisescope without a server, as httpx's ``MockTransport``.

:class:`MemoryTransport` is a ``noisescope.Transport`` that acts as the ingest server does, in
memory: it creates runs (``PUT``), stores samples and events with insert-or-ignore on
(run, seq), so that a re-sent batch is stored once, takes status updates (``PATCH``) and
heartbeats, and refuses with the server's status (422, 404, 413) what the server would refuse,
by the client's own wire rules (``noisescope.protocol``). Pass it to ``noisescope.init``::

    from noisescope.testing import MemoryTransport

    server = MemoryTransport()
    run = noisescope.init(project="p", task="t", transport=server)
    ...  # the training loop under test
    run.finish()
    assert len(server.rows(run.id)) == steps

Faults are scripted: ``faults`` holds answers consumed one per request before any is served (an
HTTP status, a status with headers such as ``Retry-After``, or an exception to raise, e.g.
``noisescope.TransportError``); ``down = True`` makes every request fail as an unreachable
server does; ``delay`` makes each answer late; ``on_request`` sees each request first.
"""

from __future__ import annotations

import gzip
import json
import re
import threading
import time
import zlib
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

from noisescope import _wire
from noisescope._sample_rule import sample_problem
from noisescope._transport import Request, Response, TransportError

__all__ = ["Fault", "MemoryTransport"]

#: A scripted answer: an HTTP status, a status with headers, or an exception to raise.
Fault: TypeAlias = int | tuple[int, dict[str, str]] | Exception

_ROUTE = re.compile(
    rf"{re.escape(_wire.API_PREFIX)}/runs/(?P<run>[^/?]+)(?P<part>/samples|/events|/heartbeat)?"
)


class _Refused(Exception):
    """What the server would answer instead of storing: a status and its detail."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def _answer(status: int, payload: Mapping[str, Any] | None = None) -> Response:
    body = b"" if payload is None else json.dumps(payload).encode()
    headers = {"Content-Type": "application/json"} if payload is not None else {}
    return Response(status, body, headers)


class MemoryTransport:
    """An in-memory noisescope ingest server, behind the ``Transport`` seam; thread-safe.

    What it stored (read them under ``lock``, or through :meth:`rows` and :meth:`event_rows`):
    ``runs`` (run id -> the run's fields: the ``PUT`` body, updated by ``PATCH``), ``samples``
    (run id -> seq -> one sample as ``{column: value}``), ``events`` (run id -> seq -> event).
    What it was asked: ``requests`` (``(time.monotonic(), Request)`` in order), ``batch_sizes``
    (the number of samples of each stored sample request), ``heartbeats`` (run ids, one per
    heartbeat) and ``closed`` (the client called :meth:`close`).
    """

    def __init__(self, *, down: bool = False, dashboard_url: str | None = None) -> None:
        self.lock = threading.Lock()
        self.runs: dict[str, dict[str, Any]] = {}
        self.samples: dict[str, dict[int, dict[str, Any]]] = {}
        self.events: dict[str, dict[int, dict[str, Any]]] = {}
        #: Answers given before any request is served, one per request, first in first out.
        self.faults: list[Fault] = []
        #: While True every request raises ``TransportError`` (the server is unreachable).
        self.down = down
        #: Seconds each request waits before it is answered.
        self.delay = 0.0
        #: Called with each request before it is answered (on the client's sending thread).
        self.on_request: Callable[[Request], None] | None = None
        #: The link a new run is answered with (``dashboard_url``), as a server with a
        #: dashboard gives it; None: no link.
        self.dashboard_url = dashboard_url
        self.requests: list[tuple[float, Request]] = []
        self.batch_sizes: list[int] = []
        self.heartbeats: list[str] = []
        self.closed = False
        self._unseq = 0  # keys for events sent without a seq (each is stored)

    # -- the Transport protocol -------------------------------------------------------------
    def handle_request(self, request: Request) -> Response:
        """Answer ``request`` as the server would, or as the next scripted fault says."""
        with self.lock:
            self.requests.append((time.monotonic(), request))
            fault = self.faults.pop(0) if self.faults else None
            down = self.down
        if self.on_request is not None:
            self.on_request(request)
        if self.delay:
            time.sleep(self.delay)
        if down:
            raise TransportError("connection refused (MemoryTransport.down)")
        if isinstance(fault, Exception):
            raise fault
        if fault is not None:
            status, headers = fault if isinstance(fault, tuple) else (fault, {})
            return Response(status, json.dumps({"detail": f"fault {status}"}).encode(), headers)
        try:
            return self._serve(request)
        except _Refused as refused:
            return _answer(refused.status, {"detail": refused.detail})

    def close(self) -> None:
        self.closed = True

    # -- what was stored -----------------------------------------------------------------
    def rows(self, run_id: str) -> list[dict[str, Any]]:
        """The run's stored samples in seq order, each ``{column: value}``."""
        with self.lock:
            stored = self.samples.get(run_id, {})
            return [stored[seq] for seq in sorted(stored)]

    def event_rows(self, run_id: str) -> list[dict[str, Any]]:
        """The run's stored events in the order they were sent (``seq``, ``step``, ``kind``,
        ``payload``, ``time``)."""
        with self.lock:
            return list(self.events.get(run_id, {}).values())

    def sample_posts(self) -> list[Request]:
        """Every request that carried samples, stored or not, in order."""
        with self.lock:
            return [r for _, r in self.requests if r.path.endswith("/samples")]

    # -- the API ---------------------------------------------------------------------------
    def _serve(self, request: Request) -> Response:
        match = _ROUTE.fullmatch(request.path)
        if match is None:
            raise _Refused(404, "Not Found")
        run_id, part = match.group("run"), match.group("part")
        problem = _wire.run_id_problem(run_id)
        if problem is not None:
            raise _Refused(422, problem)
        method = request.method.upper()
        if part is None and method == "PUT":
            return self._put_run(run_id, _payload(request))
        if method != ("PATCH" if part is None else "POST"):
            raise _Refused(405, "Method Not Allowed")
        with self.lock:
            if run_id not in self.runs:
                raise _Refused(404, f"run {run_id} not found")
        if part is None:
            return self._patch_run(run_id, _payload(request))
        if part == "/heartbeat":
            with self.lock:
                self.heartbeats.append(run_id)
            return Response(204)
        if part == "/events":
            return self._post_events(run_id, _payload(request))
        return self._post_samples(run_id, _payload(request))

    def _put_run(self, run_id: str, body: Any) -> Response:
        if not isinstance(body, dict):
            raise _Refused(422, "the run's body must be a JSON object")
        unknown = sorted(set(body) - set(_wire.RUN_BODY_FIELDS))
        if unknown:
            raise _Refused(422, f"unknown fields {unknown}")
        problem = _wire.run_fields_problem(
            project=body.get("project"),
            task=body.get("task"),
            name=body.get("name", ""),
            config=body.get("config", {}),
            tags=body.get("tags", []),
        ) or _wire.units_problem(body.get("units", "examples"))
        if body.get("status", "running") not in _wire.RUN_STATUSES:
            problem = problem or f"status must be one of {_wire.RUN_STATUSES}"
        if problem is not None:
            raise _Refused(422, problem)
        with self.lock:
            created = run_id not in self.runs
            self.runs.setdefault(run_id, {}).update(body)
            self.samples.setdefault(run_id, {})
            self.events.setdefault(run_id, {})
        answer = {"dashboard_url": self.dashboard_url} if self.dashboard_url else {}
        return _answer(201 if created else 200, answer)

    def _patch_run(self, run_id: str, body: Any) -> Response:
        if not isinstance(body, dict):
            raise _Refused(422, "the update must be a JSON object")
        status = body.get("status")
        if status is not None and status not in _wire.RUN_STATUSES:
            raise _Refused(422, f"status must be one of {_wire.RUN_STATUSES}, got {status!r}")
        with self.lock:
            self.runs[run_id].update(body)
        return _answer(200, {})

    def _post_samples(self, run_id: str, body: Any) -> Response:
        columns = body.get("columns") if isinstance(body, dict) else None
        if not isinstance(columns, dict):
            raise _Refused(422, 'the body must be {"columns": {name: [values]}}')
        unknown = sorted(set(columns) - set(_wire.SAMPLE_COLUMNS))
        missing = sorted(set(_wire.REQUIRED_COLUMNS) - set(columns))
        if unknown or missing:
            raise _Refused(422, f"unknown columns {unknown}, missing columns {missing}")
        lengths = {len(v) if isinstance(v, list) else -1 for v in columns.values()}
        if len(lengths) != 1 or -1 in lengths:
            raise _Refused(422, "every column must be a list, all of one length")
        n = lengths.pop()
        if n > _wire.MAX_SAMPLES_PER_REQUEST:
            raise _Refused(413, f"{n} samples; the limit is {_wire.MAX_SAMPLES_PER_REQUEST}")
        names = _wire.SAMPLE_COLUMNS
        rows: list[list[Any]] = [
            [columns[c][i] if c in columns else None for c in names] for i in range(n)
        ]
        refused = [f"row {i}: {p}" for i, row in enumerate(rows) if (p := sample_problem(row))]
        if refused:
            raise _Refused(422, "; ".join(refused[:20]))
        inserted = 0
        with self.lock:
            self.batch_sizes.append(n)
            stored = self.samples[run_id]
            for row in rows:
                sample = dict(zip(names, row, strict=True))
                seq: int = sample["seq"]  # an integer: sample_problem checked it
                if seq not in stored:
                    stored[seq] = sample
                    inserted += 1
        return _answer(200, {"received": n, "inserted": inserted})

    def _post_events(self, run_id: str, body: Any) -> Response:
        events = body.get("events") if isinstance(body, dict) else None
        if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
            raise _Refused(422, 'the body must be {"events": [{...}, ...]}')
        if len(events) > _wire.MAX_EVENTS_PER_REQUEST:
            raise _Refused(
                413, f"{len(events)} events; the limit is {_wire.MAX_EVENTS_PER_REQUEST}"
            )
        for i, event in enumerate(events):
            problem = _wire.event_problem(
                event.get("step"), event.get("kind"), event.get("payload", {})
            )
            seq = event.get("seq")
            if seq is not None and (type(seq) is not int or seq < 0):
                problem = problem or f"seq must be an integer >= 0, got {seq!r:.40}"
            if problem is not None:
                raise _Refused(422, f"event {i}: {problem}")
        inserted = 0
        with self.lock:
            stored = self.events[run_id]
            for event in events:
                key = event.get("seq")
                if key is None:  # no seq: not idempotent, stored each time it comes
                    self._unseq -= 1
                    key = self._unseq
                if key not in stored:
                    stored[key] = event
                    inserted += 1
        return _answer(200, {"received": len(events), "inserted": inserted})


def _payload(request: Request) -> Any:
    """The request's JSON body (gzip undone), or None when it has none."""
    body = request.body or b""
    if len(body) > _wire.MAX_BODY_BYTES:
        raise _Refused(413, f"the body is larger than {_wire.MAX_BODY_BYTES} bytes")
    encoding = next(
        (v for k, v in request.headers.items() if k.lower() == "content-encoding"), None
    )
    if encoding == "gzip":
        try:
            body = gzip.decompress(body)
        except (OSError, EOFError, zlib.error) as exc:
            raise _Refused(400, f"the gzip body does not decompress: {exc}") from None
    if not body:
        return None
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise _Refused(422, f"the body is not JSON: {exc}") from None
