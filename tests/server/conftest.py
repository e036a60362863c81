"""Module-scoped servers for the endpoint tests, on SQLite and on PostgreSQL.

``server`` is the app in the test's process (``harness.inprocess.AppServer``: the same
app and settings as ``python -m noisescope_server``, called through ASGI), which starts in a
fraction of a second; ``server_process`` is the real process (``ServerProcess``), for tests of
what only a process shows (raw bytes on a socket, its command line and environment). Each
test module shares one per backend; tests isolate themselves with unique run ids and project
names.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine
from starlette.testclient import TestClient

from harness import AppServer, ServerProcess
from tests.conftest import BACKENDS, fresh_database

#: The module servers' limits: a 1 MiB body and 10 000 samples, so limit tests stay small.
LIMITS = {"NOISESCOPE_MAX_BODY_BYTES": str(1 << 20), "NOISESCOPE_MAX_SAMPLES": "10000"}


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
def server(backend_url: str) -> Iterator[AppServer]:
    """The app in this process (auth off; ``LIMITS``)."""
    with AppServer(database_url=backend_url, env=LIMITS) as app:
        yield app


@pytest.fixture(scope="module")
def server_process(backend_url: str) -> Iterator[ServerProcess]:
    """A real server process (auth off; ``LIMITS``), on the same database as ``server``."""
    with ServerProcess(database_url=backend_url, env=LIMITS) as proc:
        yield proc


@pytest.fixture
def client(server: AppServer) -> Iterator[TestClient]:
    with server.client() as c:
        yield c


@pytest.fixture
def run_id() -> str:
    return uuid.uuid4().hex
