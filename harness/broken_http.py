"""A deliberately broken HTTP server on loopback: every answer is what the caller scripts (wrong
content type, wrong shape, a trickle, a gzip bomb, a reset), for the read client's failure
modes (tests/client/test_api_failures.py and ``python -m reliability``)."""

from __future__ import annotations

import contextlib
import gzip
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

from harness.loopback import LoopbackServer

__all__ = ["Answer", "BrokenServer", "bomb", "json_answer", "reset", "trickle"]

#: What the server does with one connection once it has read the request's head.
Behaviour = Callable[[socket.socket], None]


@dataclass(frozen=True)
class Answer:
    """A whole HTTP/1.1 answer: ``status``, ``body`` and its headers, sent at once."""

    body: bytes
    status: int = 200
    content_type: str = "application/json"
    extra: tuple[tuple[str, str], ...] = ()

    def raw(self) -> bytes:
        head = [f"HTTP/1.1 {self.status} X", f"Content-Type: {self.content_type}"]
        head += [f"Content-Length: {len(self.body)}", "Connection: close"]
        head += [f"{k}: {v}" for k, v in self.extra]
        return ("\r\n".join(head) + "\r\n\r\n").encode() + self.body

    def __call__(self, conn: socket.socket) -> None:
        conn.sendall(self.raw())


def json_answer(text: str, status: int = 200) -> Answer:
    return Answer(text.encode(), status)


def trickle(answer: Answer, every: float = 0.2, *, head_too: bool = False) -> Behaviour:
    """``answer`` a byte each ``every`` seconds: its body only, or (``head_too``) from its first
    byte, so that no read ever waits longer than ``every``."""

    def send(conn: socket.socket) -> None:
        raw = answer.raw()
        start = 0 if head_too else raw.index(b"\r\n\r\n") + 4
        conn.sendall(raw[:start])
        for i in range(start, len(raw)):
            conn.sendall(raw[i : i + 1])
            time.sleep(every)

    return send


def bomb(decoded_bytes: int) -> Answer:
    """A gzip answer of ``decoded_bytes`` zeros (about a thousandth of that on the wire)."""
    body = gzip.compress(b"0" * decoded_bytes, compresslevel=9)
    return Answer(body, extra=(("Content-Encoding", "gzip"),))


def reset(after: bytes = b"") -> Behaviour:
    """Send ``after`` (e.g. half an answer), then reset the connection (RST, no FIN)."""

    def send(conn: socket.socket) -> None:
        if after:
            conn.sendall(after)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    return send


class BrokenServer(LoopbackServer):
    """Listens on a free loopback port; each connection's request head is read, then
    ``behaviour`` (settable at any time) answers it, and the connection is closed."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.requests: list[bytes] = []
        super().__init__()

    def serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(30)
            head = b""
            with contextlib.suppress(OSError):
                while b"\r\n\r\n" not in head:
                    data = conn.recv(65536)
                    if not data:
                        return
                    head += data
                self.requests.append(head)
                self.behaviour(conn)
