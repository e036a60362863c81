"""Hostile inputs against the real server: right 4xx naming the problem, nothing stored
changed; nasty-but-valid names round-trip verbatim; schemathesis finds no 5xx.

Regressions found by the reliability harness: a NUL character in a run name or series gave a
500 on PostgreSQL (text cannot hold U+0000); searching runs for a name with a backslash
(PostgreSQL's LIKE escape) or a non-ASCII capital (SQLite's ASCII-only lower()) found nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from reliability._hostile import build_corpus, run_corpus, run_roundtrips
from reliability._infra import Server


def test_hostile_corpus_gets_4xx_naming_the_problem_and_changes_nothing(
    rel_server: Server, rel_engine: Any
) -> None:
    results, unchanged = run_corpus(rel_server.url, rel_engine, build_corpus(64 << 20))
    wrong = [(r.case.name, r.status, r.detail[:120]) for r in results if not r.ok]
    assert wrong == []
    assert unchanged


def test_nasty_valid_names_round_trip_and_search_finds_exactly_them(rel_server: Server) -> None:
    trips = run_roundtrips(rel_server.url)
    assert [(t.what, t.sent[:40], t.got[:80]) for t in trips if not t.ok] == []


def test_schemathesis_finds_no_server_error(rel_server: Server, tmp_path: Path) -> None:
    report = tmp_path / "st.json"
    cmd = [
        sys.executable, "-m", "schemathesis.cli", "run",
        f"{rel_server.url}/api/v1/openapi.json",
        "--checks", "not_a_server_error", "--phases", "fuzzing", "-n", "3", "--seed", "7",
        "--workers", "1", "--no-color", "--generation-database", "none",
        "--report", "json", "--report-json-path", str(report),
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    summary = json.loads(report.read_text())
    assert summary["test_cases"]["generated"] > 0, out.stdout[-2000:]
    assert summary["failures"] == [], out.stdout[-4000:]
    assert out.returncode == 0, out.stdout[-4000:]


@pytest.mark.parametrize("field", ["project", "task", "name"])
def test_nul_in_names_is_a_422_on_every_backend(rel_server: Server, field: str) -> None:
    import uuid

    import httpx

    body = {"project": "p", "task": "t", field: "a\x00b"}
    r = httpx.put(f"{rel_server.url}/api/v1/runs/{uuid.uuid4().hex}", json=body, timeout=30)
    assert r.status_code == 422, r.text
    assert field in r.json()["detail"]
    assert "NUL" in r.json()["detail"]


def test_out_of_range_token_id_is_a_422_not_a_500(tmp_path: Path) -> None:
    """Regression (schemathesis, full run): DELETE /api/v1/tokens/<id beyond int64> raised an
    OverflowError in the SQLite driver and answered 500."""
    import httpx

    with Server(f"sqlite:///{tmp_path / 't.db'}") as server:
        r = httpx.delete(f"{server.url}/api/v1/tokens/6532007761745118458548322304", timeout=30)
        assert r.status_code == 422, r.text
        assert "token_id" in r.json()["detail"]
        assert httpx.delete(f"{server.url}/api/v1/tokens/5", timeout=30).status_code == 404


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/runs/nul-check/series?series=a%00b",
        "/api/v1/runs?search=a%00b",
        "/api/v1/runs?project=a%00b&task=t%00",
        "/api/v1/tasks?project=%00",
        "/api/v1/runs/nul-check/samples.csv?series=%00",
    ],
)
def test_nul_in_query_parameters_is_never_a_500(rel_server: Server, path: str) -> None:
    """Regression (schemathesis, full run): a NUL in a query parameter reached PostgreSQL as
    text and answered 500; a value the database cannot use is now a 422 saying so."""
    import httpx

    with httpx.Client(base_url=rel_server.url, timeout=30) as client:
        # a run exists, so the CSV export gets as far as streaming (it used to drop the
        # connection mid-answer on PostgreSQL); not run "0", which schemathesis may have made
        # in another project or deleted (a deleted id answers 410)
        made = client.put("/api/v1/runs/nul-check", json={"project": "p", "task": "t"})
        assert made.status_code in (200, 201), made.text
        r = client.get(path)
    assert r.status_code == 422, r.text
    assert "NUL" in r.json()["detail"]
