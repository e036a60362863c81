"""The Runs page on more runs than it draws first (``views/runs.py`` ``FIRST_RUNS``): the
newest runs drawn while the rest is read give way to one table of the whole list, and a list
cut at the most one read takes says so."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import ServerProcess
from noisescope_dashboard import _text
from noisescope_server import crud, db

from ._app import plain, texts
from .conftest import MakeApp

#: More than the page draws first (``FIRST_RUNS`` = 100).
N_RUNS = 130


@pytest.fixture(scope="module")
def many_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path: Path = tmp_path_factory.mktemp("many_runs") / "noisescope.db"
    url = f"sqlite:///{path}"
    engine = db.make_engine(url)
    db.upgrade(engine)
    for i in range(N_RUNS):
        run = crud.RunIn(project="team", task=f"task{i % 3}", name=f"run-{i:03d}")
        crud.upsert_run(engine, f"many-{i:03d}", run)
    engine.dispose()
    with ServerProcess(url) as proc:
        yield proc.url


def test_the_whole_list_replaces_the_newest_runs_drawn_first(
    make_app: MakeApp, many_runs: str
) -> None:
    at = make_app(many_runs, "runs")
    assert len(at.dataframe) == 1  # the first table gave way, not a second table beside it
    table = at.dataframe[0].value
    assert len(table) == N_RUNS
    assert table["name"].iloc[0] == f"run-{N_RUNS - 1:03d}"  # newest first
    page = plain(texts(at))
    assert f"{N_RUNS} of {N_RUNS} runs" in page
    assert "reading the rest" not in page


def test_a_filtered_page_draws_only_the_runs_that_match(make_app: MakeApp, many_runs: str) -> None:
    at = make_app(many_runs, "runs", task=["task1"])
    assert len(at.dataframe) == 1
    table = at.dataframe[0].value
    expected = len([i for i in range(N_RUNS) if i % 3 == 1])
    assert len(table) == expected and set(table["task"]) == {"task1"}
    assert f"{expected} of {N_RUNS} runs" in plain(texts(at))


def test_a_list_cut_at_the_most_one_read_takes_says_older_runs_are_not_listed() -> None:
    assert _text.runs_shown(12, 300, 10_000) == "12 of 300 runs"
    cut = _text.runs_shown(10_000, 10_000, 10_000)
    assert cut.startswith("10,000 of 10,000 runs (the newest 10,000")
    assert "older runs, if any, are not listed" in cut
