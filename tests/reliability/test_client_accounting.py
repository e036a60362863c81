"""Regression: the client's ``status()`` must count each acknowledged sample once.

Found by the reliability harness (server SIGKILLed during load): when a spool replay was
interrupted part-way through a segment, the next replay re-posted the segment's already
acknowledged batches and ``status().sent`` counted them again (87 200 "sent" for 80 000
samples), breaking ``queued + sent + spooled + dropped = committed``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import noisescope
from harness import ServerProcess
from noisescope import Request, Response, TransportError
from tests.support.waiting import wait_for


class FlakyTransport:
    """The real HTTP transport, with scripted connection failures on samples POSTs."""

    def __init__(self, url: str) -> None:
        self.inner = noisescope.HTTPTransport(url)
        self.lock = threading.Lock()
        self.down = True
        self.script: list[bool] = []  # per samples POST: True = fail
        self.posts = 0

    def handle_request(self, request: Request) -> Response:
        with self.lock:
            is_post = request.method == "POST" and request.path.endswith("/samples")
            fail = self.down or (is_post and self.script and self.script.pop(0))
            if is_post:
                self.posts += 1
        if fail:
            raise TransportError("connection refused (scripted)")
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess() as proc:
        yield proc


def test_interrupted_spool_replay_does_not_count_samples_twice(
    server: ServerProcess, tmp_path: Path
) -> None:
    transport = FlakyTransport(server.url)
    run = noisescope.init(
        url=server.url,
        project="acct",
        dir=tmp_path,
        transport=transport,
        batch_max=100,
        batch_interval=0.05,
        backoff_base=0.05,
        backoff_max=0.2,
        quiet=True,
    )
    for step in range(1001):  # step 1000 stays open until finish
        run.log_sample(step, 8.0, 32.0, 6.0, 2.3)
    deadline = time.monotonic() + 30
    while run.status().spooled < 1000 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert run.status().spooled == 1000  # ten batches in one spool segment
    with transport.lock:
        # replay: batches 1-3 acknowledged, then the connection drops mid-segment
        transport.script = [False, False, False, True]
        transport.down = False
    status = run.finish(timeout=30)
    assert (status.spooled, status.dropped, status.queued) == (0, 0, 0)
    assert status.sent == 1001, status


def test_backoff_survives_a_very_long_outage() -> None:
    """Regression: 2.0**failures overflowed after ~1000 failed retries (hours of outage at the
    default 30 s cap); the sender then raised on every tick instead of backing off."""
    from noisescope._retry import Backoff

    backoff = Backoff(0.5, 30.0)
    delays = [backoff.next_delay() for _ in range(5000)]
    assert max(delays) <= 30.0
    assert min(delays[20:]) >= 15.0  # still capped and jittered, not reset


def _sabotage_spool(run: noisescope.Run) -> None:
    """Replace the run's spool directory by a file: every segment write now fails (OSError),
    as with a read-only or vanished disk (root ignores permission bits, so no chmod)."""
    import shutil

    spool_dir = Path(run.status().spool_dir or "")
    assert spool_dir.is_dir()
    shutil.rmtree(spool_dir)
    spool_dir.write_text("not a directory")


def test_status_adds_up_while_a_replay_is_interrupted(
    server: ServerProcess, tmp_path: Path
) -> None:
    """Regression: samples of a spool segment the server had already taken were counted both
    sent and spooled until the whole segment was replayed and deleted."""
    transport = FlakyTransport(server.url)
    run = noisescope.init(url=server.url, project="acct", dir=tmp_path, transport=transport,
                          batch_max=1000, batch_interval=0.05, backoff_base=5.0,
                          backoff_max=5.0, quiet=True)  # fmt: skip
    for step in range(12_001):  # step 12000 stays open
        run.log_sample(step, 8.0, 32.0, 6.0, 2.3)
    assert wait_for(lambda: run.status().spooled == 12_000)
    with transport.lock:
        # replay in requests of 5000: the first is acknowledged, then the connection drops
        transport.script = [False, True]
        transport.down = False
    assert wait_for(lambda: not transport.script)
    time.sleep(0.3)
    status = run.status()
    assert (status.sent, status.spooled, status.queued, status.dropped) == (5000, 7000, 1, 0), (
        status
    )
    status = run.finish(timeout=30)
    assert (status.sent, status.spooled, status.queued, status.dropped) == (12_001, 0, 0, 0), status


def test_unwritable_spool_keeps_samples_in_memory_through_an_outage(
    server: ServerProcess, tmp_path: Path
) -> None:
    """Regression: with the spool unwritable, every batch of an outage was dropped at once
    although the in-memory bound (memory_max) had room for it."""
    transport = FlakyTransport(server.url)
    transport.down = False
    run = noisescope.init(url=server.url, project="acct", dir=tmp_path, transport=transport,
                          batch_max=100, batch_interval=0.05, backoff_base=0.05,
                          backoff_max=0.2, quiet=True)  # fmt: skip
    _sabotage_spool(run)
    with transport.lock:
        transport.down = True
    for step in range(1001):
        run.log_sample(step, 8.0, 32.0, 6.0, 2.3)
    time.sleep(1.0)  # the outage: batches fail, the spool cannot take them
    assert run.status().dropped == 0
    with transport.lock:
        transport.down = False
    status = run.finish(timeout=30)
    assert (status.sent, status.dropped, status.queued) == (1001, 0, 0), status


def _finish_unreachable(server: ServerProcess, tmp_path: Path, timeout: float) -> noisescope.Status:
    """501 samples logged with the server down and the spool unwritable, then finish()."""
    transport = FlakyTransport(server.url)
    run = noisescope.init(url=server.url, project="acct", dir=tmp_path, transport=transport,
                          batch_max=100, batch_interval=0.05, backoff_base=0.05,
                          backoff_max=0.2, quiet=True)  # fmt: skip
    _sabotage_spool(run)
    for step in range(501):
        run.log_sample(step, 8.0, 32.0, 6.0, 2.3)
    return run.finish(timeout=timeout)


def test_what_neither_server_nor_disk_took_at_finish_is_counted_dropped(
    server: ServerProcess, tmp_path: Path
) -> None:
    status = _finish_unreachable(server, tmp_path, timeout=1.0)
    assert (status.sent, status.spooled, status.queued, status.dropped) == (0, 0, 0, 501), status


class _HoldFirstSpoolError(logging.Handler):
    """Holds the sender thread at its first 'cannot write spool' warning until finish() has
    counted what it drained: the thread then puts its failed batch back into a buffer that
    finish() has already emptied (the race CI hit once)."""

    def __init__(self) -> None:
        super().__init__()
        self.drained = threading.Event()
        self.held = False

    def handle(self, record: logging.LogRecord) -> bool:
        self.emit(record)  # without the handler's lock: the other thread logs meanwhile
        return True

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "could not be sent or spooled" in message:
            self.drained.set()
        elif "cannot write spool" in message and threading.current_thread().daemon:
            self.held = self.drained.wait(10.0)


def test_a_batch_put_back_after_finish_drained_the_buffer_is_counted(
    server: ServerProcess, tmp_path: Path
) -> None:
    handler = _HoldFirstSpoolError()
    logger = logging.getLogger("noisescope")
    logger.addHandler(handler)
    try:
        status = _finish_unreachable(server, tmp_path, timeout=0.5)
    finally:
        logger.removeHandler(handler)
    assert handler.held, "the sender thread never reached the spool error"
    assert (status.sent, status.spooled, status.queued, status.dropped) == (0, 0, 0, 501), status
