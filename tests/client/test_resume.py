"""Resuming a run (issue 55 item 7): a job killed after step 999 and restarted from its
checkpoint at step 900 continues its run: the server ends with every step once, the restarted
session's samples are numbered after the first one's (none refused as already held, none
counted dropped), and the 100 samples of the repeated steps 900-999 are not sent, counted and
said. Real client processes against a real server, on SQLite and PostgreSQL."""

from __future__ import annotations

import csv
import io
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import noisescope
from harness import ServerProcess

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def server(db_url: str) -> Iterator[ServerProcess]:
    with ServerProcess(db_url) as proc:
        yield proc


def _job(server: ServerProcess, root: Path, case: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "reliability._round4_job", case, server.url, str(root), *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "NOISESCOPE_QUIET"},
    )


def test_a_job_restarted_from_its_checkpoint_continues_its_run(
    server: ServerProcess, tmp_path: Path
) -> None:
    run_id = "resumed-job"
    first = _job(server, tmp_path, "killed", run_id, "0", "1000")
    assert first.stdout is not None and first.stdout.readline().strip() == run_id
    assert first.stdout.readline().strip() == "flushed"
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    assert server.api().run(run_id).last_step == 999  # step 999 was open: flush committed it

    second = _job(server, tmp_path, "resumed", run_id, "900", "1500")
    _, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    summary = server.api().run(run_id)
    rows = list(csv.DictReader(io.StringIO(server.api().samples_csv(run_id))))
    steps = sorted(int(row["step"]) for row in rows)
    assert steps == list(range(1500)), (len(steps), steps[:3], steps[-3:])
    assert (summary.n_samples, summary.status, summary.last_step) == (1500, "finished", 1499)
    # the repeated steps kept their first copy (the first session's loss at step 950)
    at_950 = [row for row in rows if int(row["step"]) == 950]
    assert len(at_950) == 1
    assert noisescope.Api(server.url).event_counts(run_id).get("eval") == 15  # 0..1400, once
    [line] = [x for x in err.splitlines() if x.startswith(f"noisescope: run {run_id}")]
    assert "queued 0, sent 500, spooled 0, dropped 0" in line, line
    assert "100 samples and 1 event of steps up to 999, repeated after the resume" in line, line
    assert "already held" not in err and "used before" not in err, err


def test_resume_must_refuses_a_run_the_server_does_not_have(
    server: ServerProcess, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="has no run nowhere-run"):
        noisescope.init(url=server.url, dir=tmp_path, run_id="nowhere-run", resume="must")
    with pytest.raises(ValueError, match="resume needs the run's id"):
        noisescope.init(url=server.url, dir=tmp_path, resume=True)
    run = noisescope.init(url=server.url, dir=tmp_path, run_id="new-run", resume=True, quiet=True)
    run.log_sample(0, 8.0, 64.0, 2.0, 1.0)
    status = run.finish(timeout=30)  # allow: a run that does not exist yet is started
    assert (status.sent, status.dropped) == (1, 0), status
    assert server.api().run("new-run").n_samples == 1
