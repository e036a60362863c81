"""The harness's stored-row and crashed-run checks on both backends: rows written around the
API (a config nested 300 deep) read back clipped with a 200; a silent run reads crashed."""

from __future__ import annotations

from typing import Any

from reliability._infra import Server
from reliability._stored import run_crashed, run_stored


def test_rows_stored_around_the_api_still_read(rel_server: Server, rel_engine: Any) -> None:
    checks = run_stored(rel_server.url, rel_engine)
    assert [(c.what, c.got) for c in checks if not c.ok] == []
    assert any("clipped" in c.got for c in checks)


def test_silent_runs_read_crashed_until_a_heartbeat(rel_server: Server, rel_engine: Any) -> None:
    checks = run_crashed(rel_server.url, rel_engine)
    assert [(c.what, c.expected, c.got) for c in checks if not c.ok] == []
