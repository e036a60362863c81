"""CI-sized load and fault scenarios through the real client and server processes.

Each asserts the reconciliation by SQL: every logged sample stored exactly once with the
logged values (or, for a killed client, every acknowledged or spooled sample).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from reliability._faults import client_killed, readonly_spool
from reliability._infra import Server
from reliability._load import run_load, server_kills

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sqlite_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One SQLite server that the fault scenarios below kill and restart."""
    path = tmp_path_factory.mktemp("faults") / "f.db"
    with Server(f"sqlite:///{path}") as server:
        yield server


def test_small_load_reconciles_exactly(rel_server: Server, tmp_path: Path) -> None:
    r = run_load(rel_server, backend="x", workdir=tmp_path, runs=3, samples=1500, rate=0,
                 time_limit=300)  # fmt: skip
    assert r.problems == []
    assert (r.recon.logged, r.recon.stored, r.recon.duplicates) == (4500, 4500, 0)
    assert r.recon.exact and r.dropped == 0
    assert len(r.latencies) >= 3


def test_server_sigkilled_twice_during_load_loses_and_duplicates_nothing(
    sqlite_server: Server, tmp_path: Path
) -> None:
    r = run_load(sqlite_server, backend="sqlite", workdir=tmp_path, runs=2, samples=3000,
                 rate=600, injector=server_kills(2, 1.5, 0.5), time_limit=300)  # fmt: skip
    assert len(r.faults) >= 1, r.problems
    assert r.problems == []
    assert r.recon.exact, r.recon.runs
    assert r.dropped == 0


@pytest.mark.parametrize("during_outage", [False, True], ids=["sending", "spooling"])
def test_client_sigkilled_mid_batch_then_sync_stores_acked_and_spooled_once(
    sqlite_server: Server, tmp_path: Path, during_outage: bool
) -> None:
    result = client_killed(sqlite_server, tmp_path, samples=6000, rate=2000,
                           during_outage=during_outage)  # fmt: skip
    assert result.problems == []
    assert result.ok, result.facts


def test_readonly_spool_never_crashes_the_client_and_counts_drops(
    sqlite_server: Server, tmp_path: Path
) -> None:
    result = readonly_spool(sqlite_server, tmp_path, samples=3000, rate=2000)
    assert result.problems == []
    assert result.ok, result.facts
