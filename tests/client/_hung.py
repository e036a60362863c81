"""A server that accepts connections and reads requests but never answers (a hung process)."""

from __future__ import annotations

import contextlib
import socket
import threading


class HungServer:
    """Listens on a free loopback port; every connection is read and never answered."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.connections = 0
        self.bytes_read = 0
        self._stop = threading.Event()
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        self._sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            self.connections += 1
            self._conns.append(conn)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
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
        self._stop.set()
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.close()
        self._sock.close()

    def __enter__(self) -> HungServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
