"""Shared fixtures: ``db_url`` (SQLite and PostgreSQL), ``app_server`` (the app in this process),
``live_server`` (a real server process) and ``one_torch_thread``.

``db_url`` is parametrised over a temporary SQLite file and the PostgreSQL server at
``NOISESCOPE_TEST_PG`` (default ``postgresql+psycopg://postgres@127.0.0.1:5432/test``). Each
PostgreSQL test gets its own freshly created database (``ns_test_<random>``), dropped afterwards,
so tests are isolated and can run in parallel. With ``CI=true`` an unreachable PostgreSQL FAILS
the test (the run is required there); elsewhere it is skipped with the reason.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from harness import ServerProcess, postgres


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with a ``slow`` test first, then the rest by their number of tests (most first).

    scripts/test.sh hands whole files to its xdist workers in this order
    (``--no-loadscope-reorder``), so the longest files start early instead of one of them
    running alone at the end while the other workers idle (xdist's own order, by number of
    tests, left the README steps' 4-minute test for last)."""
    by_file: dict[str, list[pytest.Item]] = {}
    slow: set[str] = set()
    for item in items:
        path = item.nodeid.split("::")[0]
        by_file.setdefault(path, []).append(item)
        if item.get_closest_marker("slow") is not None:
            slow.add(path)
    order = sorted(by_file, key=lambda path: (path not in slow, -len(by_file[path])))
    items[:] = [item for path in order for item in by_file[path]]


if TYPE_CHECKING:
    from harness import AppServer

# Inductor compiles in this process, not in a worker pool: the 2-rank tests fork this process,
# and a child inherits a pool whose threads did not survive the fork, so its first compilation
# waits forever (tests/probes/test_fsdp.py after any compiling test, with a cold cache).
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

PG_URL = os.environ.get("NOISESCOPE_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@contextlib.contextmanager
def fresh_pg_database() -> Iterator[str]:
    """Create an empty PostgreSQL database, yield its URL, drop it afterwards.

    Skips (or, with CI=true, fails) the calling test when PostgreSQL is unreachable.
    """
    try:
        postgres.connect(PG_URL, timeout=3).close()
    except Exception as exc:  # psycopg.OperationalError and friends
        message = f"PostgreSQL at {PG_URL} is unreachable: {exc}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{message} (required when CI=true)")
        pytest.skip(message)
    with postgres.fresh_database(PG_URL, "ns_test") as url:
        yield url


@contextlib.contextmanager
def fresh_database(backend: str, folder: Path) -> Iterator[str]:
    """An empty database of ``backend`` ("sqlite": a file in ``folder``; "postgresql": see
    ``fresh_pg_database``), its URL yielded."""
    if backend == "sqlite":
        yield f"sqlite:///{folder / 'noisescope.db'}"
        return
    with fresh_pg_database() as url:
        yield url


@contextlib.contextmanager
def app_on(backend: str, folder: Path, **settings: Any) -> Iterator[AppServer]:
    """The server's app in this process (``AppServer(**settings)``) on an empty database of
    ``backend`` (``fresh_database``)."""
    from harness import AppServer

    with fresh_database(backend, folder) as url, AppServer(database_url=url, **settings) as app:
        yield app


#: The backends every storage test runs on; PostgreSQL's marked, so that it can be deselected.
BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for this test (dropped afterwards)."""
    with fresh_pg_database() as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'noisescope.db'}"


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest) -> str:
    """A fresh database URL, once for SQLite and once for PostgreSQL."""
    name = "sqlite_url" if request.param == "sqlite" else "pg_url"
    url: str = request.getfixturevalue(name)
    return url


@pytest.fixture
def app_server() -> Iterator[AppServer]:
    """The server's app in this process (harness/inprocess.py) on a temporary SQLite
    database: for tests of what the server stores and answers."""
    from harness import AppServer  # FastAPI's import only where it is used

    with AppServer() as server:
        yield server


@pytest.fixture
def live_server() -> Iterator[ServerProcess]:
    """A real server (``python -m noisescope_server``) on a temporary SQLite database: for
    tests that need the process (kills, restarts, other processes logging to it)."""
    with ServerProcess() as server:
        yield server


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """torch with one intra-op thread for the test (the cores are shared: one is fastest here),
    the setting before it restored afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
