"""Module-scoped real servers for the endpoint tests, on SQLite and on PostgreSQL.

Starting a server costs seconds, so each test module shares one per backend; tests isolate
themselves with unique run ids and project names.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import Engine, create_engine

from tests.conftest import BACKENDS, fresh_database
from tests.support.servers import ServerProcess


@pytest.fixture(scope="module", params=BACKENDS)
def backend_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    with fresh_database(request.param, tmp_path_factory.mktemp("db")) as url:
        yield url


@pytest.fixture
def engine(backend_url: str) -> Iterator[Engine]:
    """An engine on the module's server database (the rows the server stored)."""
    eng = create_engine(backend_url)
    try:
        yield eng
    finally:
        eng.dispose()


@pytest.fixture(scope="module")
def server(backend_url: str) -> Iterator[ServerProcess]:
    """A real server (auth off; 1 MiB body limit so limit tests stay small)."""
    limits = {"NOISESCOPE_MAX_BODY_BYTES": str(1 << 20), "NOISESCOPE_MAX_SAMPLES": "10000"}
    with ServerProcess(database_url=backend_url, env=limits) as proc:
        yield proc


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


@pytest.fixture
def run_id() -> str:
    return uuid.uuid4().hex
