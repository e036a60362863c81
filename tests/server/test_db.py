"""The server's engine waits for a PostgreSQL that refuses connections (a restart) for up to
``db.CONNECT_WAIT`` seconds instead of failing the request at once."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from harness import free_port
from noisescope_server import db


class LateProxy:
    """A TCP forwarder to PostgreSQL that starts listening only when ``open()`` is called:
    until then its port refuses connections, as a restarting database does."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self._server: socket.socket | None = None

    def open(self) -> None:
        self._server = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        assert self._server is not None
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            dst.close()

    def close(self) -> None:
        if self._server is not None:
            self._server.close()


@pytest.fixture
def proxied(pg_url: str) -> Iterator[tuple[str, LateProxy]]:
    url = make_url(pg_url)
    proxy = LateProxy((url.host or "127.0.0.1", url.port or 5432))
    try:
        yield url.set(host="127.0.0.1", port=proxy.port).render_as_string(False), proxy
    finally:
        proxy.close()


def test_a_refused_connection_is_retried_until_the_database_is_back(
    proxied: tuple[str, LateProxy],
) -> None:
    url, proxy = proxied
    engine = db.make_engine(url, connect_wait=db.CONNECT_WAIT)
    opener = threading.Timer(0.5, proxy.open)  # the database comes back while we wait
    opener.start()
    try:
        with engine.connect() as conn:
            assert conn.execute(text("select 1")).scalar() == 1
    finally:
        opener.cancel()
        engine.dispose()


def test_without_the_wait_a_refused_connection_fails_at_once(
    proxied: tuple[str, LateProxy],
) -> None:
    url, _ = proxied
    engine = db.make_engine(url)
    try:
        with pytest.raises(OperationalError), engine.connect():
            pass
    finally:
        engine.dispose()


def test_the_wait_is_bounded(proxied: tuple[str, LateProxy]) -> None:
    url, _ = proxied  # never opened
    engine = db.make_engine(url, connect_wait=0.3)
    try:
        with pytest.raises(OperationalError), engine.connect():
            pass
    finally:
        engine.dispose()
