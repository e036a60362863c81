"""A small fault-injecting HTTP proxy to put in front of the real server in fault tests.

Each request first consumes one scripted fault, if any:
- ``500`` / ``503`` / ``429``: answer that status without contacting the server
  (429 carries ``Retry-After: <retry_after>``);
- ``"slow"``: forward, then hold the answer ``slow_seconds`` (past the client's timeout);
- ``"lost"``: forward (the server commits!), then drop the connection without an answer,
  the case that makes a client resend data the server already has;
- ``"reset"``: drop the connection without forwarding.

``answer`` (optional) sees every request that no scripted fault took: (method, path, body) to
(status, JSON body, seconds to hold it) answered without the server, or None to forward.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

Fault = int | str
#: (method, path, body) -> (status, JSON body, seconds held before answering), or None: forward.
Answer = Callable[[str, str, bytes], tuple[int, bytes, float] | None]


class FaultProxy:
    def __init__(
        self,
        upstream: str,
        retry_after: float = 0.2,
        slow_seconds: float = 1.0,
        answer: Answer | None = None,
    ):
        parts = urlsplit(upstream)
        self.upstream_host = parts.hostname or "127.0.0.1"
        self.upstream_port = parts.port or 80
        self.retry_after = retry_after
        self.slow_seconds = slow_seconds
        self.faults: deque[Fault] = deque()
        self.answer = answer
        self.lock = threading.Lock()
        self.counts: dict[str, int] = {}
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with proxy.lock:
                    fault = proxy.faults.popleft() if proxy.faults else None
                    key = str(fault) if fault is not None else "pass"
                    proxy.counts[key] = proxy.counts.get(key, 0) + 1
                if fault == "reset":
                    self._drop()
                    return
                scripted = None
                if fault is None and proxy.answer is not None:
                    scripted = proxy.answer(self.command, self.path, body)
                if scripted is not None:
                    status, payload, hold = scripted
                    time.sleep(hold)
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                if isinstance(fault, int):
                    payload = b'{"detail": "injected fault"}'
                    self.send_response(fault)
                    if fault == 429:
                        self.send_header("Retry-After", str(proxy.retry_after))
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                try:
                    status, headers, answer = proxy._forward(
                        self.command, self.path, dict(self.headers), body
                    )
                except OSError:
                    self.send_response(502)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if fault == "lost":
                    self._drop()
                    return
                if fault == "slow":
                    time.sleep(proxy.slow_seconds)
                self.send_response(status)
                for name, value in headers:
                    if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def _drop(self) -> None:
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)

            do_GET = do_PUT = do_POST = do_PATCH = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _forward(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(self.upstream_host, self.upstream_port, timeout=30)
        try:
            headers = {k: v for k, v in headers.items() if k.lower() != "host"}
            conn.request(method, path, body=body, headers=headers)
            answer = conn.getresponse()
            return answer.status, answer.getheaders(), answer.read()
        finally:
            conn.close()

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


#: The first request is held this long: many batch intervals, so the guard copies it to the
#: spool and spills the batches behind it (which the replay merges with the copy).
HOLD_S = 1.5


class RefuseFirstBatch:
    """Proxy rule, once ``armed``: the samples of the first samples request are refused (422,
    no ``rows``) wherever they are sent again; the first answer is held ``HOLD_S``."""

    def __init__(self) -> None:
        self.armed = False
        self.poisoned: set[int] = set()
        self.refusals = 0
        self._lock = threading.Lock()

    def __call__(self, method: str, path: str, body: bytes) -> tuple[int, bytes, float] | None:
        if not self.armed or method != "POST" or not path.endswith("/samples"):
            return None
        seqs = set(json.loads(body)["columns"]["seq"])
        with self._lock:
            hold = 0.0
            if not self.poisoned:
                self.poisoned |= seqs
                hold = HOLD_S
            elif not self.poisoned & seqs:
                return None
            self.refusals += 1
        return 422, b'{"detail": "refused by the test proxy"}', hold
