"""``reliability._round3_reads`` at small sizes (issue 46, items 9-11 on the read side): every
case holds. One server on SQLite with its access log (the token case reads it); the server's
behaviour on both backends is tested in tests/server/test_round3_reads.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from reliability._infra import Server
from reliability._round3_reads import run_round3_reads


@pytest.fixture(scope="module")
def logged_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder: Path = tmp_path_factory.mktemp("round3_reads")
    with Server(f"sqlite:///{folder / 'noisescope.db'}", log_level="info") as server:
        yield server


def test_every_read_case_holds(logged_server: Server) -> None:
    cases = run_round3_reads(logged_server.url, layers=50, events=3000, log=logged_server.log)
    assert [c.item for c in cases] == ["9a", "9b", "9c", "9d", "10", "10", "11"]
    assert all(c.ok for c in cases), [(c.name, c.outcome) for c in cases if not c.ok]
