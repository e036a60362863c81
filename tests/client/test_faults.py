"""Fault tests against the REAL server process: down at start, SIGKILLed and restarted,
slow answers, 5xx, 429 and lost answers. Afterwards the database must hold every sample
exactly once.

Stated bound for the training loop: no ``log_sample``/``log`` call sends a request itself,
while the server is killed, restarted, slow or failing; the network is the sender thread's.
The transport notes the thread of every request, so this is checked exactly rather than timed
(the calls' cost is measured in ``benchmarks/log_overhead.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import noisescope
from harness import ServerProcess, free_port
from harness.fault_proxy import FaultProxy
from noisescope import HTTPTransport, Request, Response
from noisescope.cli import main as cli_main
from tests.support.database import query
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, str]]:
    """One server (SQLite) for the tests that do not kill it: every test uses its own run,
    and exactly-once is checked per run, so they cannot see each other's samples."""
    db_url = f"sqlite:///{tmp_path_factory.mktemp('shared') / 'noisescope.db'}"
    with ServerProcess(db_url) as proc:
        yield proc, db_url


def stored(db_url: str, run_id: str) -> list[tuple[int, int, float, float | None]]:
    """(seq, step, g_small_sq, loss) of every stored sample of a run, by seq."""
    rows = query(
        db_url,
        "SELECT s.seq, s.step, s.g_small_sq, s.loss FROM sample s "
        "JOIN run r ON r.id = s.run_id WHERE r.uid = :uid ORDER BY s.seq",
        uid=run_id,
    )
    return [(int(a), int(b), float(c), d) for a, b, c, d in rows]


def run_status(db_url: str, run_id: str) -> str:
    [row] = query(db_url, "SELECT status FROM run WHERE uid = :u", u=run_id)
    return str(row.status)


def assert_exactly_once(db_url: str, run_id: str, n: int) -> None:
    rows = stored(db_url, run_id)
    assert len(rows) == n, f"{len(rows)} rows stored, {n} logged"
    assert [r[0] for r in rows] == list(range(n))
    assert [r[1] for r in rows] == list(range(n))
    assert [r[2] for r in rows] == [2.0 + step for step in range(n)]
    assert all(r[3] == pytest.approx(1.0 / (r[1] + 1)) for r in rows)


class WatchedTransport(HTTPTransport):
    """The real HTTP transport, counting requests sent from inside a training-loop call."""

    def __init__(self, url: str, timeout: float) -> None:
        super().__init__(url, None, timeout)
        self.loop_thread: int | None = None
        self.requests_in_loop_calls = 0

    def handle_request(self, request: Request) -> Response:
        if threading.get_ident() == self.loop_thread:
            self.requests_in_loop_calls += 1
        return super().handle_request(request)


class Loop:
    """A training loop stand-in; ``check_bound`` says whether a client call did network I/O."""

    def __init__(self, run: noisescope.Run, transport: WatchedTransport) -> None:
        self.run = run
        self.transport = transport
        self.step = 0
        self.calls = 0

    def steps(self, n: int, pause: float = 0.0) -> None:
        for _ in range(n):
            step = self.step
            self._watched(self.run.log_sample, step, 8, 64, 2.0 + step, 1.0)
            self._watched(self.run.log, step, loss=1.0 / (step + 1))
            self.step += 1
            if pause:
                time.sleep(pause)

    def check_bound(self) -> None:
        assert self.calls > 0
        assert self.transport.requests_in_loop_calls == 0, "a log call sent a request itself"

    def _watched(self, call: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        self.transport.loop_thread = threading.get_ident()
        try:
            call(*args, **kwargs)
        finally:
            self.transport.loop_thread = None
        self.calls += 1


def fast_retry_run(url: str, tmp_path: Path, **kwargs: object) -> tuple[noisescope.Run, Loop]:
    options: dict[str, object] = {
        "url": url,
        "project": "faults",
        "task": "client",
        "dir": tmp_path / "spool",
        "batch_max": 100,
        "batch_interval": 0.05,
        "backoff_base": 0.05,
        "backoff_max": 0.5,
        "request_timeout": 2.0,
        "flush_timeout": 60.0,
    }
    options.update(kwargs)
    transport = WatchedTransport(url, float(options["request_timeout"]))  # type: ignore[arg-type]
    run = noisescope.init(transport=transport, **options)  # type: ignore[arg-type]
    return run, Loop(run, transport)


def test_server_down_at_start(db_url: str, tmp_path: Path) -> None:
    port = free_port()
    proc = ServerProcess(db_url, port=port)
    run, loop = fast_retry_run(f"http://127.0.0.1:{port}", tmp_path)
    loop.steps(500)
    assert wait_for(lambda: run.status().spooled == 499)  # step 499 is still open
    proc.start()
    try:
        loop.steps(500)
        status = run.finish()
        assert (status.sent >= 1000, status.spooled, status.dropped) == (True, 0, 0)
        assert_exactly_once(db_url, run.id, 1000)
        assert run_status(db_url, run.id) == "finished"
    finally:
        proc.close()
    loop.check_bound()


def test_sigkill_and_restart_mid_run(sqlite_url: str, tmp_path: Path) -> None:
    server = ServerProcess(sqlite_url).start()
    try:
        _kill_and_restart_mid_run(sqlite_url, server, tmp_path)
    finally:
        server.close()


def _kill_and_restart_mid_run(db_url: str, server: ServerProcess, tmp_path: Path) -> None:
    run, loop = fast_retry_run(server.url, tmp_path)
    cycles = 3
    done = threading.Event()
    kills: list[int] = []

    def chaos() -> None:
        for _ in range(cycles):
            target = run.status().sent + 300
            wait_for(lambda target=target: run.status().sent >= target, timeout=60)  # type: ignore[misc]
            server.kill()
            kills.append(loop.step)
            time.sleep(0.5)  # down long enough for batches to hit the spool
            server.start()
        done.set()

    killer = threading.Thread(target=chaos)
    killer.start()
    deadline = time.monotonic() + 120
    while not done.is_set() and time.monotonic() < deadline:
        loop.steps(10, pause=0.005)
    killer.join()
    loop.steps(200)
    status = run.finish()
    assert len(kills) == cycles
    assert (status.spooled, status.dropped) == (0, 0)
    assert_exactly_once(db_url, run.id, loop.step)
    loop.check_bound()


@pytest.mark.parametrize(
    "faults",
    [
        [500, 503, 500, 502, 500],
        [429, 429, 429],
        ["lost", "lost", "lost"],
        ["slow", "slow"],
        ["reset", 500, "lost", 429, "slow", "reset"],
    ],
    ids=["5xx", "429", "lost-answers", "slow", "mixed"],
)
def test_faulty_network_in_front_of_real_server(
    shared_server: tuple[ServerProcess, str], tmp_path: Path, faults: list[int | str]
) -> None:
    server, db_url = shared_server
    _through_faulty_proxy(db_url, server, tmp_path, faults)


@pytest.mark.postgres
def test_lost_answers_and_kills_on_postgresql(pg_url: str, tmp_path: Path) -> None:
    """The same faults with PostgreSQL behind the server (its insert-or-ignore path)."""
    server = ServerProcess(pg_url).start()
    try:
        _through_faulty_proxy(pg_url, server, tmp_path, ["lost", 500, "lost", 429, "reset"])
        server.kill()
        server.start()
        _through_faulty_proxy(pg_url, server, tmp_path / "again", ["lost", "lost"])
    finally:
        server.close()


def _through_faulty_proxy(
    db_url: str, server: ServerProcess, tmp_path: Path, faults: list[int | str]
) -> None:
    proxy = FaultProxy(server.url, retry_after=0.1, slow_seconds=1.0).start()
    try:
        run, loop = fast_retry_run(proxy.url, tmp_path, request_timeout=0.3)
        loop.steps(200)
        run.flush(30)
        proxy.faults.extend(faults)  # hit the samples path, not only run creation
        loop.steps(800, pause=0.0002)
        status = run.finish()
    finally:
        proxy.stop()
    assert not proxy.faults, "every scripted fault was exercised"
    assert (status.spooled, status.dropped) == (0, 0)
    assert_exactly_once(db_url, run.id, 1000)
    loop.check_bound()


def test_run_ended_while_server_down_then_sync_cli(sqlite_url: str, tmp_path: Path) -> None:
    db_url = sqlite_url
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    run, loop = fast_retry_run(url, tmp_path, flush_timeout=0.5)
    loop.steps(300)
    status = run.finish()
    assert (status.spooled, status.sent) == (300, 0)
    proc = ServerProcess(db_url, port=port)
    proc.start()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "noisescope.cli", "sync", str(tmp_path / "spool")],
            capture_output=True,
            text=True,
            env={"NOISESCOPE_URL": url, "PATH": "/usr/bin:/bin"},
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert f"synced {run.id}" in result.stdout
        assert_exactly_once(db_url, run.id, 300)
        assert run_status(db_url, run.id) == "finished"
    finally:
        proc.close()
    assert not (tmp_path / "spool" / run.id).exists()


EXIT_SCRIPT = """
import sys, noisescope
run = noisescope.init(url=sys.argv[1], project="faults", task="atexit", dir=sys.argv[2],
                      flush_timeout=float(sys.argv[3]), batch_interval=0.05)
print(run.id, flush=True)
for step in range(300):
    run.log_sample(step, 8, 64, 2.0 + step, 1.0)
    run.log(step, loss=1.0 / (step + 1))
# no finish(): the interpreter's exit must flush
"""


LOUD_ENV = {**os.environ, "NOISESCOPE_QUIET": "0"}


def run_exit_script(
    url: str, spool: Path, flush_timeout: float
) -> subprocess.CompletedProcess[str]:
    """EXIT_SCRIPT in a child with ``flush_timeout``; its stdout is the run id."""
    return subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT, url, str(spool), str(flush_timeout)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env=LOUD_ENV,
    )


def test_interpreter_exit_flushes_without_finish(
    shared_server: tuple[ServerProcess, str], tmp_path: Path
) -> None:
    server, sqlite_url = shared_server
    done = run_exit_script(server.url, tmp_path / "spool", 30)
    run_id = done.stdout.split()[0]
    assert_exactly_once(sqlite_url, run_id, 300)
    assert run_status(sqlite_url, run_id) == "finished"
    assert "sent 300, spooled 0, dropped 0" in done.stderr
    assert not (tmp_path / "spool" / run_id).exists()


def test_interpreter_exit_with_server_down_spools_and_says_how_to_sync(
    sqlite_url: str, tmp_path: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    spool = tmp_path / "spool"
    # An exit that waited on the retry schedule (the server never comes back) instead of
    # ~flush_timeout (1 s) would run into the subprocess timeout.
    done = run_exit_script(url, spool, 1.0)
    run_id = done.stdout.split()[0]
    lines = [line for line in done.stderr.splitlines() if line.startswith("noisescope:")]
    # the first failure is said at once in the training log, then the summary at exit
    assert len(lines) == 2, done.stderr
    assert lines[0].startswith(f"noisescope: cannot deliver to {url}")
    assert "spooled 300" in lines[1]
    assert f"noisescope sync {spool} --url {url}" in lines[1]
    with ServerProcess(sqlite_url, port=port):
        assert cli_main(["sync", str(spool), "--url", url]) == 0
        assert_exactly_once(sqlite_url, run_id, 300)
        assert run_status(sqlite_url, run_id) == "finished"
