"""An ending during ``finish()`` (issue 55 item 5): SIGTERM, SIGHUP or Ctrl-C while ``finish()``
waits for a server that hangs leaves what the server has not taken in the spool before the
process ends, and the finish line says so; ``noisescope sync`` then delivers all of it. Real
client processes, a server that accepts and never answers, then a real server for the sync."""

from __future__ import annotations

import csv
import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import noisescope
from harness import ServerProcess
from harness.hung import HungServer

pytestmark = pytest.mark.slow

LOGGED = 3200
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess() as proc:
        yield proc


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_an_ending_during_finish_leaves_the_rest_in_the_spool_and_says_so(
    server: ServerProcess, tmp_path: Path, signum: int
) -> None:
    with HungServer() as hung:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "reliability._round4_job",
                "finishing",
                hung.url,
                str(tmp_path),
                "",
                "0",
                str(LOGGED),
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={k: v for k, v in os.environ.items() if k != "NOISESCOPE_QUIET"},
        )
        assert proc.stdout is not None
        run_id = proc.stdout.readline().strip()
        time.sleep(0.2)  # finish() is waiting for the hung server
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
    assert run_id and "finish returned" not in out, (out, err)
    assert proc.returncode == -signum, err  # it still ends by the signal (Ctrl-C: by SIGINT)
    name = signal.Signals(signum).name
    # said: what the server did not take is in the spool, and how to send it
    [line] = [x for x in err.splitlines() if x.startswith(f"noisescope: run {run_id}")]
    if signum != signal.SIGINT:
        assert f"the process got {name} while finishing" in line, err
    assert f"queued 0, sent 0, spooled {LOGGED}, dropped 0" in line, line
    assert "noisescope sync" in line, line
    result = noisescope.sync(tmp_path, url=server.url)
    assert result.failed == {} and result.samples == LOGGED, result
    rows = list(csv.DictReader(io.StringIO(server.api().samples_csv(run_id))))
    assert sorted(int(row["step"]) for row in rows) == list(range(LOGGED))
    assert not (tmp_path / run_id).exists()
