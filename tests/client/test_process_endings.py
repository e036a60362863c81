"""However a training process ends, what it logged is delivered or spooled and the run's status
says how it ended (issue 46: fork-context children, SIGTERM and SIGHUP, uncaught exceptions).
Real processes against a real server."""

from __future__ import annotations

import csv
import io
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import noisescope
from harness import ServerProcess

HEAD = """
import sys, time
import noisescope
url, spool = sys.argv[1], sys.argv[2]
def start(project):
    run = noisescope.init(url=url, project=project, dir=spool, batch_interval=0.05, quiet=True)
    print(run.id, flush=True)
    return run
"""


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess() as proc:
        yield proc


def _script(body: str) -> str:
    return HEAD + textwrap.dedent(body)


def _start(server: ServerProcess, spool: Path, body: str) -> subprocess.Popen[str]:
    env = {**os.environ, "NOISESCOPE_QUIET": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", _script(body), server.url, str(spool)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _run_id(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline().strip()


def _stored(server: ServerProcess, run_id: str) -> tuple[int, str, int]:
    """(samples stored, status, last step stored + 1)."""
    summary = server.api().run(run_id)
    rows = list(csv.DictReader(io.StringIO(server.api().samples_csv(run_id))))
    steps = {int(row["step"]) for row in rows}
    return summary.n_samples, summary.status, (max(steps) + 1 if steps else 0)


def test_a_run_started_in_a_fork_child_is_delivered(server: ServerProcess, tmp_path: Path) -> None:
    proc = _start(
        server,
        tmp_path,
        """
        import multiprocessing

        def child():
            run = start("fork-child")
            for step in range(1000):
                run.log_sample(step, 8.0, 64.0, 2.0, 1.0)
            # returns without finish(): the child ends through os._exit

        if __name__ == "__main__":
            worker = multiprocessing.get_context("fork").Process(target=child)
            worker.start()
            worker.join()
            sys.exit(worker.exitcode)
        """,
    )
    run_id = _run_id(proc)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert _stored(server, run_id) == (1000, "finished", 1000)


def test_an_uncaught_exception_records_the_run_as_failed(
    server: ServerProcess, tmp_path: Path
) -> None:
    proc = _start(
        server,
        tmp_path,
        """
        run = start("exception")
        for step in range(100):
            run.log_sample(step, 8.0, 64.0, 2.0, 1.0)
        raise KeyboardInterrupt  # Ctrl-C, no `with run:` and no finish()
        """,
    )
    run_id = _run_id(proc)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    assert _stored(server, run_id) == (100, "failed", 100)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_delivers_what_was_logged_and_fails_the_run(
    server: ServerProcess, tmp_path: Path, signum: int
) -> None:
    proc = _start(
        server,
        tmp_path,
        """
        run = start("signal")
        step = 0
        while True:
            run.log_sample(step, 8.0, 64.0, 2.0, 1.0)
            step += 1
            if step == 2000:
                print("ready", flush=True)
            time.sleep(0.0002)
        """,
    )
    run_id = _run_id(proc)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    time.sleep(0.3)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signum, err  # the process still ends by the signal
    # everything logged is on the server or in the spool: deliver the spool, count no gaps
    noisescope.sync(tmp_path, url=server.url)
    stored, status, steps = _stored(server, run_id)
    assert status == "failed" and stored == steps >= 2000
    assert not (tmp_path / run_id).exists()  # no empty spool folder left behind


def test_a_handler_that_chains_to_noisescope_decides_how_the_process_ends() -> None:
    """Lightning's SIGTERM handler calls the one it found (noisescope's) and then stops
    training gracefully: called that way, noisescope's handler neither finishes the runs nor
    ends the process."""
    from noisescope import _process

    before = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda signum, frame: _process._on_ending_signal(signum, frame))
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # would end this process if not chained
        time.sleep(0.05)
    finally:
        signal.signal(signal.SIGTERM, before)
