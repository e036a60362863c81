"""Module-scoped real servers on SQLite and PostgreSQL for the reliability tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from reliability._infra import Server
from tests.conftest import fresh_pg_database


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def rel_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """A real server (auth off) on a fresh database of each backend."""
    if request.param == "sqlite":
        path: Path = tmp_path_factory.mktemp("db") / "noisescope.db"
        with Server(f"sqlite:///{path}") as server:
            yield server
        return
    with fresh_pg_database() as url, Server(url) as server:
        yield server
