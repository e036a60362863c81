"""A server that accepts connections and reads requests but never answers (a hung process)."""

from __future__ import annotations

import contextlib
import socket

from harness.loopback import LoopbackServer


class HungServer(LoopbackServer):
    """Listens on a free loopback port; every connection is read and never answered."""

    def __init__(self) -> None:
        self.connections = 0
        self.bytes_read = 0
        self._conns: list[socket.socket] = []
        super().__init__()

    def _accepted(self, conn: socket.socket) -> None:
        self.connections += 1
        self._conns.append(conn)

    def serve(self, conn: socket.socket) -> None:
        conn.settimeout(0.1)
        while not self._stop.is_set():
            try:
                data = conn.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            self.bytes_read += len(data)

    def close(self) -> None:
        super().close()
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.close()
