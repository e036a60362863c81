"""How the app maps errors to statuses: bad input is a 4xx, a server bug a 500.

These tests patch a function the route calls, so the server runs in this process (uvicorn on a
free loopback port, a thread of the test); the HTTP exchange is the real one.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from harness import free_port, wait_for_health
from noisescope_server import queries
from noisescope_server.app import create_app
from noisescope_server.errors import BadInput
from noisescope_server.settings import Settings

API = "/api/v1"


@pytest.fixture
def in_process_url(tmp_path: Path) -> Iterator[str]:
    app = create_app(Settings(database_url=f"sqlite:///{tmp_path / 'noisescope.db'}"))
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(url, timeout=60)
        yield url
    finally:
        server.should_exit = True
        thread.join(30)


def _raise(exc: Exception) -> object:
    def boom(*_args: object, **_kwargs: object) -> object:
        raise exc

    return boom


def test_a_value_error_inside_a_route_is_a_500_not_a_422(
    in_process_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ValueError that is not BadInput is a server bug: the client must not be told to fix
    its request, nor be shown the bug's message."""
    monkeypatch.setattr(queries, "list_projects", _raise(ValueError("internal: bad state")))
    r = httpx.get(f"{in_process_url}{API}/projects", timeout=30)
    assert r.status_code == 500, r.text
    assert "internal: bad state" not in r.text


def test_bad_input_inside_a_route_is_a_4xx_with_its_message(
    in_process_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(queries, "list_projects", _raise(BadInput("pass ?x=step", 413)))
    r = httpx.get(f"{in_process_url}{API}/projects", timeout=30)
    assert r.status_code == 413, r.text
    assert r.json() == {"detail": "pass ?x=step"}
