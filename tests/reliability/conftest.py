"""Module-scoped real servers on SQLite and PostgreSQL for the reliability tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from reliability._infra import Server
from tests.conftest import BACKENDS, fresh_database


@pytest.fixture(scope="module", params=BACKENDS)
def rel_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """A real server (auth off) on a fresh database of each backend."""
    folder = tmp_path_factory.mktemp("db")
    with fresh_database(request.param, folder) as url, Server(url) as server:
        yield server
