"""Module-scoped real servers on SQLite and PostgreSQL for the reliability tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from reliability._infra import Server, engine_for
from tests.conftest import BACKENDS, fresh_database


@pytest.fixture(scope="module", params=BACKENDS)
def rel_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """A real server (auth off) on a fresh database of each backend."""
    folder = tmp_path_factory.mktemp("db")
    with fresh_database(request.param, folder) as url, Server(url) as server:
        yield server


@pytest.fixture
def rel_engine(rel_server: Server) -> Iterator[Any]:
    """An engine on the module server's database, to read what it stored."""
    engine = engine_for(rel_server.database_url)
    try:
        yield engine
    finally:
        engine.dispose()
