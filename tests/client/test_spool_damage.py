"""The spool fuzzer (issue 46, item 6): a spool the client wrote offline, damaged one way per
case, then sync against the real app: only the damaged records are lost, each is named, the
other run is delivered whole, the printed count is what the server stored, the exit code says
whether anything was left behind, and a second sync stores nothing more
(``reliability/_spool_damage.py`` holds the damages and the checks; ``python -m reliability``
runs them bigger, with the command against a server process).

Every kind runs on SQLite; PostgreSQL takes the two whose requests differ (a row the server
refuses, a segment stored twice), on one module server each.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import AppServer
from reliability._spool_damage import DAMAGES, in_process_sync, run_case
from tests.conftest import app_on

#: Damage that sync names without a sample count: a torn record (its JSON is cut, so its size
#: is unknown) and a run whose run.json is unreadable (named failed; it stays in the spool).
UNCOUNTED = ("torn segment", "unreadable run.json")
ON_POSTGRESQL = ("a value the server refuses", "duplicated segment")
CASES = [pytest.param("sqlite", name, id=f"sqlite-{name}") for name in DAMAGES] + [
    pytest.param("postgresql", name, id=f"postgresql-{name}", marks=pytest.mark.postgres)
    for name in ON_POSTGRESQL
]


@pytest.fixture(scope="module")
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AppServer]:
    """The app on a fresh database of the backend the case names, one per module."""
    with app_on(request.param, tmp_path_factory.mktemp("db")) as app:
        yield app


@pytest.mark.parametrize(("server", "name"), CASES, indirect=["server"])
def test_sync_loses_only_the_damaged_records_and_names_them(
    server: AppServer, name: str, tmp_path: Path
) -> None:
    api = server.api()
    result = run_case(name, tmp_path / "spool", in_process_sync(server.url, server.transport), api)
    assert result.ok, result.problems
    if name not in UNCOUNTED:  # every logged sample stored, or counted in what sync said
        assert result.stored + result.dropped_counted == result.logged, result
