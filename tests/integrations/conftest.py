"""A real noisescope server (SQLite) shared by the integration tests, and a reader for its rows.

The callbacks are exercised end to end: training -> probe -> Run -> HTTP -> server -> database.
Rows are read back with SQLAlchemy from the server's SQLite file (no mocks of the database).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness import ServerProcess
from tests.support.database import query

# Keep the 2-core machine usable for everyone: one intra-op thread per training process.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    path: Path = tmp_path_factory.mktemp("integrations-db") / "noisescope.db"
    with ServerProcess(database_url=f"sqlite:///{path}") as proc:
        yield proc


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """Every integration test trains with ``one_torch_thread``."""


@dataclass
class Stored:
    """A run as the server stored it: its row and its whole-model samples by step."""

    run: dict[str, Any]
    samples: list[dict[str, Any]]


def stored_run(server: ServerProcess, run_id: str, series: str = "") -> Stored:
    (run,) = query(server.database_url, "SELECT * FROM run WHERE uid = :uid", uid=run_id)
    samples = query(
        server.database_url,
        "SELECT sample.* FROM sample JOIN series s ON s.run_id = sample.run_id "
        "AND s.id = sample.series_id WHERE sample.run_id = :id AND s.name = :series ORDER BY step",
        id=run.id,
        series=series,
    )
    return Stored(dict(run._mapping), [dict(r._mapping) for r in samples])


def assert_same_samples(
    expected: list[dict[str, Any]], actual: list[dict[str, Any]], rel: float
) -> None:
    """The same training measured twice (eager and compiled): equal batch sizes, equal
    squared norms and losses within ``rel``."""
    assert len(actual) == len(expected)
    for want, got in zip(expected, actual, strict=True):
        assert (got["b_small"], got["b_big"]) == (want["b_small"], want["b_big"])
        for key in ("g_small_sq", "g_big_sq", "loss"):
            assert got[key] == pytest.approx(want[key], rel=rel)
