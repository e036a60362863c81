"""The harness's issue-29 sections at CI size: the read client against a broken server, numeric
edge values on every numeric query parameter, and broken bodies with auth on."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from reliability._disconnects import run_auth_disconnects
from reliability._edges import run_edges
from reliability._infra import Server
from reliability._read_client import run_read_client

ADMIN = "round2-admin"


def test_every_read_client_failure_is_an_api_error_in_time() -> None:
    cases = run_read_client(8 << 20)
    assert [(c.name, c.raised, c.message[:80]) for c in cases if not c.ok] == []


def test_numeric_edge_values_get_an_answer_or_a_named_refusal(rel_server: Server) -> None:
    result = run_edges(rel_server.url)
    assert result.requests > 300 and result.failures == []


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    path: Path = tmp_path_factory.mktemp("db") / "noisescope.db"
    env = {"NOISESCOPE_ADMIN_TOKEN": ADMIN, "NOISESCOPE_READ_TIMEOUT": "2"}
    with Server(f"sqlite:///{path}", auth="write", log_level="info", env=env) as server:
        yield server


def test_broken_bodies_with_auth_on_log_no_traceback(auth_server: Server) -> None:
    made = httpx.post(
        f"{auth_server.url}/api/v1/projects/proj/tokens",
        headers={"Authorization": f"Bearer {ADMIN}"},
    )
    results = run_auth_disconnects(auth_server.url, made.json()["token"], repeats=1)
    assert [(r.name, r.got[:60]) for r in results if not r.ok] == []
    time.sleep(0.5)  # the last answers' log lines
    log = auth_server.log()
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log
