"""Compaction by the processes that run it: ``noisescope db compact`` killed in the middle
loses nothing and a second one finishes the job; the server's compactor compacts a finished
run by itself and its reads over HTTP stay the same."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx
import pytest
from sqlalchemy import Engine, func, select

from harness import ServerProcess
from harness.payloads import columns
from noisescope import protocol
from noisescope.cli import main
from noisescope_server import crud, db, queries
from noisescope_server.models import Sample, SampleChunk
from tests.support.waiting import wait_for


def _counts(engine: Engine) -> tuple[int, int]:
    """Sample rows, and samples in chunks."""
    with engine.connect() as conn:
        rows = int(conn.execute(select(func.count()).select_from(Sample)).scalar_one())
        packed = conn.execute(select(func.sum(SampleChunk.n))).scalar_one()
    return rows, int(packed or 0)


def _fill(engine: Engine, uid: str, n: int) -> None:
    crud.upsert_run(engine, uid, crud.RunIn(project="p", task="t", batch_size=32))
    for k, name in enumerate(("", "layer.0", "layer.1")):
        cols = columns(n, seed=k, series=name)
        cols["seq"] = [3 * s + k for s in cols["seq"]]
        crud.ingest_samples(engine, uid, crud.validate_samples({"columns": cols}))


def test_db_compact_killed_midway_loses_nothing(db_url: str) -> None:
    engine = db.make_engine(db_url)
    db.upgrade(engine)
    _fill(engine, "big", 4000)
    crud.patch_run(engine, "big", status="finished")
    before = "".join(queries.raw_samples_csv(engine, "big"))
    command = [sys.executable, "-m", "noisescope.cli", "db", "--database-url", db_url]
    proc = subprocess.Popen(
        [*command, "compact", "--chunk-rows", "8"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        assert wait_for(lambda: _counts(engine)[1] > 0, timeout=120), "no chunk written"
        os.killpg(proc.pid, signal.SIGKILL)  # in the middle: 1,500 chunks of 8
    finally:
        proc.kill()
        proc.wait()
    rows, packed = _counts(engine)
    assert rows > 0, "the compaction finished before the kill: the test proves nothing"
    assert rows + packed == 12_000  # each sample a row or in a chunk, never both
    assert "".join(queries.raw_samples_csv(engine, "big")) == before
    assert main([*command[3:], "compact"]) == 0  # carries on where the killed one stopped
    assert _counts(engine) == (0, 12_000)
    assert "".join(queries.raw_samples_csv(engine, "big")) == before
    engine.dispose()


@pytest.mark.parametrize("unknown", [["--run", "nope"]])
def test_db_compact_names_an_unknown_run(
    sqlite_url: str, unknown: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["db", "--database-url", sqlite_url, "compact", *unknown]) == 1
    assert "no run 'nope'" in capsys.readouterr().err


def test_the_server_compacts_a_finished_run_by_itself(sqlite_url: str) -> None:
    env = {"NOISESCOPE_COMPACT_EVERY": "0.2", "NOISESCOPE_COMPACT_FINISHED_AFTER": "0"}
    with ServerProcess(database_url=sqlite_url, env=env) as server:
        api = f"{server.url}{protocol.API_PREFIX}"
        with httpx.Client(timeout=30) as http:
            http.put(f"{api}/runs/done", json={"project": "p", "task": "t"}).raise_for_status()
            cols = columns(500)
            http.post(f"{api}/runs/done/samples", json={"columns": cols}).raise_for_status()
            csv_before = http.get(f"{api}/runs/done/samples.csv").text
            series_before = http.get(f"{api}/runs/done/series").json()
            http.patch(f"{api}/runs/done", json={"status": "finished"}).raise_for_status()
            engine = db.make_engine(sqlite_url)
            assert wait_for(lambda: _counts(engine) == (0, 500), timeout=60), server.log()
            assert http.get(f"{api}/runs/done/samples.csv").text == csv_before
            assert http.get(f"{api}/runs/done/series").json() == series_before
            # a late sample of the compacted run: stored once, read with the rest
            late = columns(10, start=500)
            for _ in range(2):
                answer = http.post(f"{api}/runs/done/samples", json={"columns": late})
                answer.raise_for_status()
            assert http.get(f"{api}/runs/done").json()["n_samples"] == 510
            engine.dispose()
