"""A TCP server on a free loopback port that hands each connection to ``serve`` in a thread of
its own: the base of the test servers that misbehave on purpose (``broken_http.BrokenServer``,
``hung.HungServer``)."""

from __future__ import annotations

import socket
import threading
from typing import TypeVar

__all__ = ["LoopbackServer"]

_S = TypeVar("_S", bound="LoopbackServer")


class LoopbackServer:
    """Listens on a free loopback port (``url``) until ``close``; a context manager."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port: int = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()  # a subclass sets what ``serve`` reads before calling this

    def _accept(self) -> None:
        self._sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            self._accepted(conn)
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def _accepted(self, conn: socket.socket) -> None:
        """A new connection, in the accepting thread, before ``serve`` starts on it."""

    def serve(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self._stop.set()
        self._sock.close()
        self._thread.join(timeout=5)

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
