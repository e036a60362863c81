"""The harness's raw-socket cases against a real server: literal dot segments get the run-id
rule, slow bodies a 408, vanished clients an info line; the log holds no traceback."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from reliability._infra import Server
from reliability._raw import run_raw


@pytest.fixture(scope="module")
def quick_timeout_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    path: Path = tmp_path_factory.mktemp("db") / "noisescope.db"
    env = {"NOISESCOPE_READ_TIMEOUT": "2"}
    with Server(f"sqlite:///{path}", log_level="info", env=env) as server:
        yield server


def test_raw_cases_hold_and_log_no_traceback(quick_timeout_server: Server) -> None:
    results = run_raw(quick_timeout_server.url, 2.0)
    assert [(r.name, r.got[:120]) for r in results if not r.ok] == []
    assert len(results) > 15
    deadline = time.monotonic() + 30  # the server logs a vanished client once it notices
    while quick_timeout_server.log().count("disconnected before") < 4:
        assert time.monotonic() < deadline, quick_timeout_server.log()
        time.sleep(0.1)
    log = quick_timeout_server.log()
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log
