"""The harness's issue-46 section at CI size (``python -m reliability --only round3`` runs it
bigger, on both backends, with the process classes): one bad sample among good ones, and run
fields over the server's limits, against a real ``--auth write`` server on SQLite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from reliability._infra import Server
from reliability._round3 import BAD, one_bad_sample, write_auth_server
from reliability._round3_process import OVER_LIMITS, run_fields


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with write_auth_server("sqlite", tmp_path_factory.mktemp("db")) as srv:
        yield srv


def test_one_bad_sample_is_counted_and_the_rest_stored(server: Server, tmp_path: Path) -> None:
    rows = one_bad_sample(server, tmp_path, 200)
    assert len(rows) == len(BAD)
    assert [r.cells() for r in rows if not r.held] == []
    assert {(r.stored, r.dropped) for r in rows} == {(199, 1)}


def test_run_fields_over_the_limits_are_refused_before_anything_is_kept(
    server: Server, tmp_path: Path
) -> None:
    rows = run_fields(server, tmp_path)
    assert len(rows) == len(OVER_LIMITS)
    assert [r.cells() for r in rows if not r.held] == []
