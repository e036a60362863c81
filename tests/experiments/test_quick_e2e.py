"""``python -m experiments --quick`` end to end: real training, real client, real server."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import noisescope
from experiments import analysis
from experiments.__main__ import main
from experiments.runner import CACHE_CONFIG_KEY, PROJECT
from experiments.tasks import TASKS
from harness import ServerProcess
from noisescope_server.sweeps import MAX_POINTS_PER_RUN


def _assert_server_agrees(database: Path, records: list[dict[str, Any]]) -> None:
    """The server's critical-batch endpoint, on the database the study logged to, gives the
    study's own B_crit for every target: both run noisescope.sweep on the same eval losses."""
    spec = TASKS["lsq"].sized(True)
    study = analysis.analyse(
        analysis.to_sweep_runs(records), spec.loss_targets, task="lsq", units=spec.units
    )
    with ServerProcess(database_url=f"sqlite:///{database}") as server:
        api = noisescope.Api(server.url)
        try:
            served = api.critical_batch(spec.project, "lsq", targets=spec.loss_targets)
        finally:
            api.close()
    assert served.loss_source == "eval"
    assert served.n_runs == len(records) and not served.excluded
    assert [t.target for t in served.targets] == [t.target for t in study.targets]
    for mine, theirs in zip(study.targets, served.targets, strict=True):
        pairs = [(mine.b_crit, theirs.b_crit), (mine.b_crit_lo, theirs.b_crit_lo)]
        pairs.append((mine.b_crit_hi, theirs.b_crit_hi))
        for a, b in pairs:
            assert (a is None) == (b is None)
            if a is not None:
                assert b == pytest.approx(a, rel=1e-12, abs=0)
        assert theirs.determined == mine.determined
        assert theirs.warnings == mine.warnings
        assert [p.steps for p in theirs.points] == pytest.approx([p.steps for p in mine.points])
        # Runs this short keep one noise bucket per step on the server, so B_simple is the same
        # ratio of sums too (its interval is not compared: blocks follow another run order).
        assert max(r["steps"] for r in records) <= MAX_POINTS_PER_RUN
        assert (theirs.b_simple is None) == (mine.b_simple is None)
        if mine.b_simple is not None:
            assert theirs.b_simple == pytest.approx(mine.b_simple, rel=1e-9)


@pytest.mark.slow
def test_quick_sweep_logs_every_run_to_the_server_and_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "runs"
    docs = tmp_path / "docs"
    assert main(["--quick", "--tasks", "lsq", "--out", str(out), "--docs", str(docs)]) == 0

    records = [json.loads(p.read_text()) for p in (out / "quick").glob("lsq-*/B*.json")]
    assert {r["batch_size"] for r in records} == {8, 32, 128}
    assert len(records) >= 6  # the local lr search tries at least two lrs per batch size

    # Every run and every step reached the server through the client.
    db = sqlite3.connect(out / "quick" / "noisescope.db")
    try:
        runs = db.execute("SELECT name, status FROM run").fetchall()
        n_samples = db.execute("SELECT count(*) FROM sample").fetchone()[0]
    finally:
        db.close()
    assert sorted(name for name, _ in runs) == sorted(
        f"B{r['batch_size']}-lr{r['lr']:.6g}-s0" for r in records
    )
    assert {status for _, status in runs} == {"finished"}
    database = f"sqlite:///{out / 'quick' / 'noisescope.db'}"
    with ServerProcess(database_url=database) as server, noisescope.Api(server.url) as api:
        # a project of its own (never the full sweep's), each run naming its run cache
        assert api.projects() == [PROJECT + "-quick"]
        caches = {r.config[CACHE_CONFIG_KEY] for r in api.runs(current=False)}
        assert caches == {str((out / "quick").resolve())}
    assert n_samples == sum(r["steps"] for r in records)

    report = (docs / "reproduction.md").read_text()
    assert "### Noisy least squares (`lsq`)" in report
    assert "| 1 | 3 |" in report  # target 1.0 reached by all 3 batch sizes, with a fit
    for png in ("figures/reproduction_lsq_quick.png", "figures/reproduction_summary_quick.png"):
        assert (docs / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    _assert_server_agrees(out / "quick" / "noisescope.db", records)

    # A second invocation trains nothing (every run comes from the cache) and, since the
    # database was lost in between, sends every cached run to the new server again.
    (out / "quick" / "noisescope.db").unlink()
    capsys.readouterr()
    assert main(["--quick", "--tasks", "lsq", "--out", str(out), "--docs", str(docs)]) == 0
    err = capsys.readouterr().err
    assert err.count("(cached)") == len(records)
    counts = [tuple(map(int, m)) for m in re.findall(r"lsq \[(\d+)/~?(\d+)\] B=", err)]
    assert counts[0][0] == 1 and all(done <= total for done, total in counts), counts  # a total
    assert f"({len(records)} re-sent from the run cache)" in err
    db = sqlite3.connect(out / "quick" / "noisescope.db")
    try:
        assert db.execute("SELECT count(*) FROM run").fetchone()[0] == len(records)
        assert db.execute("SELECT count(*) FROM sample").fetchone()[0] == n_samples
    finally:
        db.close()
    # The re-sent runs carry their evaluations too.
    _assert_server_agrees(out / "quick" / "noisescope.db", records)
