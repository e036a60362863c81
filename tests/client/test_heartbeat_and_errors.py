"""The heartbeat, and errors that come early and say what to fix: a URL without a scheme, the
dashboard's port, a wrong token, a server that is down."""

from __future__ import annotations

import json
import logging
import re
import signal
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

import noisescope
from harness import ServerProcess, free_port
from noisescope.testing import MemoryTransport as FakeServer
from tests.support.waiting import wait_for


class RawServer:
    """A minimal HTTP server: creates runs, takes samples, answers heartbeats with
    ``heartbeat_status``, PUT with ``put_status`` (and an HTML page when ``html``)."""

    def __init__(self, heartbeat_status: int = 204, put_status: int = 201, html: bool = False):
        self.heartbeats: list[str] = []
        self.paths: list[str] = []
        raw = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _answer(self, status: int, body: bytes, kind: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _read(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def do_PUT(self) -> None:
                self._read()
                raw.paths.append(f"PUT {self.path}")
                if html:
                    self._answer(put_status, b"<!doctype html><html></html>", "text/html")
                else:
                    self._answer(put_status, json.dumps({"detail": "no"}).encode())

            def do_PATCH(self) -> None:
                self._read()
                raw.paths.append(f"PATCH {self.path}")
                self._answer(200, b"{}")

            def do_POST(self) -> None:
                self._read()
                raw.paths.append(f"POST {self.path}")
                if self.path.endswith("/heartbeat"):
                    raw.heartbeats.append(self.headers.get("Content-Length") or "0")
                    self._answer(heartbeat_status, b"")
                else:  # takes every sample (an answer without counts means all were new)
                    self._answer(200, b"{}")

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def raw() -> Iterator[RawServer]:
    server = RawServer()
    yield server
    server.close()


def test_a_quiet_run_sends_heartbeats_with_an_empty_body(raw: RawServer) -> None:
    run = noisescope.init(url=raw.url, heartbeat_interval=0.1, batch_interval=0.05)
    assert wait_for(lambda: len(raw.heartbeats) >= 3)
    assert set(raw.heartbeats) == {"0"}
    run.finish()
    assert all(p == f"POST /api/v1/runs/{run.id}/heartbeat" for p in raw.paths[1:-1])


def test_no_heartbeat_while_samples_flow() -> None:
    fake = FakeServer()
    run = noisescope.init(transport=fake, heartbeat_interval=0.3, batch_interval=0.02)
    for step in range(40):
        run.log_sample(step, 8, 64, 2.0, 1.0)
        run.flush()
    run.finish()
    assert not [r for _, r in fake.requests if r.path.endswith("/heartbeat")]


@pytest.mark.parametrize("status", [404, 405])
def test_an_older_server_without_the_endpoint_is_not_asked_again(status: int) -> None:
    raw = RawServer(heartbeat_status=status)
    try:
        run = noisescope.init(url=raw.url, heartbeat_interval=0.05, batch_interval=0.02)
        assert wait_for(lambda: len(raw.heartbeats) >= 1)
        run.log_sample(0, 8, 64, 2.0, 1.0)
        run.log_sample(1, 8, 64, 2.0, 1.0)
        assert run.flush()  # a few more ticks, each past heartbeat_interval
        status_after = run.finish()
        assert len(raw.heartbeats) == 1
        assert status_after.last_error is None
    finally:
        raw.close()


@pytest.mark.parametrize("url", ["127.0.0.1:8765", "localhost:8765", "ftp://host:1", "http://"])
def test_a_url_that_is_not_http_is_refused_at_init_with_the_fix(url: str) -> None:
    with pytest.raises(ValueError, match=r"is not an http\(s\) URL: use e\.g\."):
        noisescope.init(url=url)


def test_the_fix_for_a_url_without_a_scheme_names_it() -> None:
    with pytest.raises(ValueError, match=re.escape("'http://127.0.0.1:8765'")):
        noisescope.init(url="127.0.0.1:8765")


def test_the_read_client_checks_its_url_as_init_does(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=re.escape("use e.g. 'http://127.0.0.1:8765'")):
        noisescope.Api("127.0.0.1:8765")
    monkeypatch.setenv("NOISESCOPE_URL", "localhost:1")
    with pytest.raises(ValueError, match="is not an http"):
        noisescope.Api()
    assert noisescope.Api("http://127.0.0.1:9/").url == "http://127.0.0.1:9"


def test_sync_checks_its_url_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from noisescope.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["sync", str(tmp_path), "--url", "127.0.0.1:8765"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --url: " in err and "use e.g. 'http://127.0.0.1:8765'" in err
    monkeypatch.setenv("NOISESCOPE_URL", "127.0.0.1:8765")
    assert main(["sync", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("noisescope sync: ") and "Traceback" not in err
    assert err.count("\n") == 1 and "(set url= or NOISESCOPE_URL)" in err


@pytest.mark.parametrize(("status", "html"), [(405, False), (405, True), (200, True)])
def test_the_dashboard_port_is_named_as_not_a_noisescope_server(
    status: int, html: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="noisescope")
    dashboard = RawServer(put_status=status, html=html)
    try:
        run = noisescope.init(url=dashboard.url, flush_timeout=0.5)
        run.log_sample(0, 8, 64, 2.0, 1.0)
        result = run.finish()
    finally:
        dashboard.close()
    assert result.last_error is not None
    assert "is not a noisescope server" in result.last_error
    assert "default port is 8765" in result.last_error
    assert any("is not a noisescope server" in r.getMessage() for r in caplog.records)


def test_a_run_sent_to_the_dashboard_says_where_the_server_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dashboard's port answers a run's creation with 405: the finish line gives the
    server's URL to sync to (not the same wrong one) and says what the spool holds."""
    monkeypatch.delenv("NOISESCOPE_QUIET")
    fake = FakeServer()
    fake.faults = [405]
    run = noisescope.init(url="http://127.0.0.1:8501", transport=fake, dir=tmp_path)
    result = run.finish()
    printed = capsys.readouterr().err
    assert result.spooled == 0
    assert "this looks like the dashboard (port 8501); the server is on port 8765" in printed
    assert "The spool keeps the run, with no samples" in printed
    assert f"noisescope sync {tmp_path} --url http://127.0.0.1:8765" in printed
    assert "--url http://127.0.0.1:8501" not in printed
    assert result.last_error is not None and "kept in the spool" not in result.last_error


def test_finish_says_that_it_waits_for_a_server_that_does_not_answer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NOISESCOPE_QUIET")
    fake = FakeServer(down=True)
    run = noisescope.init(url="http://down.test:1", transport=fake, dir=tmp_path, flush_timeout=1.5)
    run.log_sample(0, 8, 64, 2.0, 1.0)
    run.finish()
    printed = capsys.readouterr().err
    assert (
        f"waiting up to 1.5 s (flush_timeout) for the server at http://down.test:1; Ctrl-C "
        f"keeps the samples in the spool ({tmp_path})"
    ) in printed
    up = noisescope.init(url="http://up.test:1", transport=FakeServer(), dir=tmp_path)
    up.log_sample(0, 8, 64, 2.0, 1.0)
    up.finish()
    assert "waiting" not in capsys.readouterr().err  # a server that answers: no word


@pytest.fixture
def ctrl_c_interrupts() -> Iterator[None]:
    """SIGINT as an interactive Python has it: Python's KeyboardInterrupt handler, the signal
    unblocked. A suite started in the background by a shell without job control inherits
    SIGINT ignored, and Ctrl-C would then never reach ``finish()``."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    yield
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    signal.signal(signal.SIGINT, before)


@pytest.mark.usefixtures("ctrl_c_interrupts")
def test_ctrl_c_while_finish_waits_spools_the_rest_says_so_and_stops(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NOISESCOPE_QUIET")
    fake = FakeServer(down=True)
    run = noisescope.init(url="http://down.test:1", transport=fake, dir=tmp_path)
    for step in range(10):
        run.log_sample(step, 8, 64, 2.0, 1.0)
    main = threading.main_thread().ident
    assert main is not None and threading.get_ident() == main
    # Ctrl-C: SIGINT to the main thread, after finish() said it waits
    ctrl_c = threading.Timer(2.0, signal.pthread_kill, (main, signal.SIGINT))
    ctrl_c.start()
    with pytest.raises(KeyboardInterrupt):
        run.finish()
    ctrl_c.join()
    status = run.status()
    printed = capsys.readouterr().err
    assert "waiting up to 30 s" in printed
    assert status.spooled == 10 and status.queued == 0
    assert "spooled 10, dropped 0; last error: connection refused (MemoryTransport.down)" in printed
    assert f"send it with: noisescope sync {tmp_path} --url http://down.test:1" in printed


def test_a_recovered_outage_leaves_no_last_error() -> None:
    fake = FakeServer(down=True)
    run = noisescope.init(url="http://flaky.test:1", transport=fake, backoff_base=0.01)
    run.log_sample(0, 8, 64, 2.0, 1.0)
    assert wait_for(lambda: run.status().last_error is not None)
    fake.down = False
    for step in range(1, 600):
        run.log_sample(step, 8, 64, 2.0, 1.0)
    result = run.finish()
    assert (result.sent, result.spooled, result.dropped) == (600, 0, 0)
    assert result.last_error is None, result.last_error
    assert "last error" not in result.line()


@pytest.mark.parametrize(("status", "said"), [(405, " is not a noisescope server"), (403, ": ")])
def test_sync_names_the_url_it_tried(tmp_path: Path, status: int, said: str) -> None:
    run = noisescope.init(mode="offline", dir=tmp_path)
    run.log_sample(0, 8, 64, 2.0, 1.0)
    run.finish()
    wrong = RawServer(put_status=status)
    try:
        result = noisescope.sync(tmp_path, url=wrong.url)
    finally:
        wrong.close()
    why = result.failed[run.id]
    assert why.startswith(f"{wrong.url}{said}"), why
    assert "creating the run: HTTP " + str(status) in why


def test_a_wrong_tokens_sync_hint_includes_the_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NOISESCOPE_QUIET")
    fake = FakeServer()
    fake.faults = [401]
    run = noisescope.init(
        url="http://srv.test:1", transport=fake, token="s3cr3t-value", dir=tmp_path
    )
    run.log_sample(0, 8, 64, 2.0, 1.0)
    result = run.finish()
    printed = capsys.readouterr().err
    assert f"noisescope sync {tmp_path} --url http://srv.test:1 --token <TOKEN>" in printed
    assert "s3cr3t-value" not in printed  # the token itself is never shown
    assert result.last_error is not None and "--token <TOKEN>" in result.last_error


def test_a_server_that_is_down_is_said_once_at_the_first_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="noisescope")
    fake = FakeServer(down=True)
    run = noisescope.init(url="http://down.test:1", transport=fake, backoff_base=0.01)
    run.log_sample(0, 8, 64, 2.0, 1.0)
    assert wait_for(lambda: any("cannot deliver" in r.getMessage() for r in caplog.records))
    assert not run.finished  # said during training, before finish
    assert wait_for(lambda: len(fake.requests) >= 5)  # several more failures
    run.finish(timeout=0.2)
    said = [r.getMessage() for r in caplog.records if "cannot deliver" in r.getMessage()]
    assert len(said) == 1
    assert "http://down.test:1" in said[0] and "noisescope sync" in said[0]


@pytest.mark.slow
def test_against_the_real_server_a_quiet_run_stays_running_a_silent_one_reads_crashed(
    tmp_path: Path,
) -> None:
    """The server reads a running run silent for crash_after as crashed: the heartbeat keeps
    a run that logs nothing for a while "running"; one whose heartbeat is off is "crashed"."""
    crash_after = 1.5
    env = {"NOISESCOPE_CRASH_AFTER": str(crash_after)}
    with ServerProcess(f"sqlite:///{tmp_path / 'ns.db'}", env=env) as server:
        quiet = noisescope.init(url=server.url, heartbeat_interval=0.2, batch_interval=0.05)
        silent = noisescope.init(url=server.url, heartbeat_interval=1e9, batch_interval=0.05)
        for run in (quiet, silent):
            run.log_sample(0, 8, 64, 2.0, 1.0)
            run.log_sample(1, 8, 64, 2.0, 1.0)
            assert run.flush()

        def status(run: noisescope.Run) -> str:
            answer = requests.get(f"{server.url}/api/v1/runs/{run.id}", timeout=10)
            return str(answer.json()["status"])

        assert wait_for(lambda: status(silent) == "crashed", timeout=30)
        assert status(quiet) == "running"
        quiet.finish()
        silent.finish()
        assert status(quiet) == "finished"
