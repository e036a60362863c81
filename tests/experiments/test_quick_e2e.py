"""``python -m experiments --quick`` end to end: real training, real client, real server."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from experiments.__main__ import main


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
    assert n_samples == sum(r["steps"] for r in records)

    report = (docs / "reproduction.md").read_text()
    assert "### Noisy least squares (`lsq`)" in report
    assert "| 1 | 3 |" in report  # target 1.0 reached by all 3 batch sizes, with a fit
    for png in ("figures/reproduction_lsq_quick.png", "figures/reproduction_summary_quick.png"):
        assert (docs / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # A second invocation trains nothing (every run comes from the cache) and, since the
    # database was lost in between, sends every cached run to the new server again.
    (out / "quick" / "noisescope.db").unlink()
    capsys.readouterr()
    assert main(["--quick", "--tasks", "lsq", "--out", str(out), "--docs", str(docs)]) == 0
    err = capsys.readouterr().err
    assert err.count("(cached)") == len(records)
    assert f"({len(records)} re-sent from the run cache)" in err
    db = sqlite3.connect(out / "quick" / "noisescope.db")
    try:
        assert db.execute("SELECT count(*) FROM run").fetchone()[0] == len(records)
        assert db.execute("SELECT count(*) FROM sample").fetchone()[0] == n_samples
    finally:
        db.close()
