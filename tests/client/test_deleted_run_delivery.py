"""A run deleted on the server stays deleted (issue 55 item 2, the client's part): the job's
client stops sending for it, says so once, counts what it did not deliver as dropped with the
reason; ``noisescope sync`` of its spool likewise, and removes that spool instead of trying it
again forever, as does a later run that finds it orphaned. Against real server processes, on
SQLite and PostgreSQL."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

import noisescope
from harness import ServerProcess
from noisescope import NotFoundError, Request, Response, TransportError
from noisescope._sync import report
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def server(db_url: str) -> Iterator[ServerProcess]:
    with ServerProcess(db_url) as proc:
        yield proc


def _log(run: noisescope.Run, steps: range) -> None:
    for step in steps:
        run.log_sample(step, 8.0, 64.0, 2.0, 1.0)


def _deleted_warnings(caplog: pytest.LogCaptureFixture, run_id: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and "was deleted on the server" in r.getMessage()
        and run_id in r.getMessage()
    ]  # fmt: skip


def test_a_run_deleted_mid_job_is_not_created_again_and_its_rest_is_counted_dropped(
    server: ServerProcess, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="noisescope")
    run = noisescope.init(url=server.url, dir=tmp_path, batch_interval=0.05, quiet=True)
    _log(run, range(500))
    assert run.flush(timeout=30)
    server.api().delete_run(run.id)
    _log(run, range(500, 1500))
    run.log(1499, eval_loss=0.5)
    status = run.finish(timeout=30)
    # 500 sent before the delete (step 499 was open, committed by flush), the rest dropped
    assert (status.sent, status.spooled, status.queued) == (500, 0, 0), status
    assert status.dropped == 1000 and status.dropped_events == 1, status
    assert "the run was deleted on the server (HTTP 410)" in (status.last_error or ""), status
    with pytest.raises(NotFoundError):
        server.api().run(run.id)  # not re-created, not even partially
    [warning] = _deleted_warnings(caplog, run.id)  # said once, with what to do
    assert "start a new run" in warning
    assert not (tmp_path / run.id).exists()  # nothing kept for a sync that cannot deliver it


def test_sync_of_a_deleted_run_says_so_once_and_removes_its_spool(
    server: ServerProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = noisescope.init(url=server.url, dir=tmp_path, quiet=True)
    _log(first, range(10))
    first.finish(timeout=30)
    server.api().delete_run(first.id)
    offline = noisescope.init(mode="offline", run_id=first.id, dir=tmp_path, quiet=True)
    _log(offline, range(300))
    offline.log(299, eval_loss=0.5)
    offline.finish()
    assert (tmp_path / first.id / "run.json").is_file()

    result = noisescope.sync(tmp_path, url=server.url)
    assert result.synced == [] and result.failed == {} and result.samples == 0, result
    why = result.deleted[first.id]
    assert "300 samples and 1 event" in why and "removed" in why, why
    assert report(result, tmp_path) == 1  # not on the server: said, exit 1
    err = capsys.readouterr().err
    assert f"deleted {first.id}: the run was deleted on the server" in err
    assert not (tmp_path / first.id).exists()
    with pytest.raises(NotFoundError):
        server.api().run(first.id)
    again = noisescope.sync(tmp_path, url=server.url)  # nothing left to try again
    assert (again.deleted, again.failed, again.synced) == ({}, {}, [])


class _Down:
    """A transport to a server that is down: every request fails without an answer."""

    def handle_request(self, request: Request) -> Response:
        raise TransportError("connection refused (the test's server is down)")

    def close(self) -> None:
        pass


def test_a_later_run_removes_an_orphaned_spool_of_a_deleted_run_and_says_so(
    server: ServerProcess, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="noisescope")
    created = noisescope.init(url=server.url, dir=tmp_path / "elsewhere", quiet=True)
    created.finish(timeout=30)
    # a job of that run during an outage: its samples wait in the spool (an online run's,
    # to this URL, which the next run here delivers)
    job = noisescope.init(
        url=server.url, run_id=created.id, dir=tmp_path, transport=_Down(), flush_timeout=0.2,
        quiet=True,
    )  # fmt: skip
    _log(job, range(200))
    assert job.finish().spooled == 200
    server.api().delete_run(created.id)

    later = noisescope.init(url=server.url, dir=tmp_path, batch_interval=0.05, quiet=True)
    _log(later, range(10))
    assert later.flush(timeout=30)
    assert wait_for(lambda: not (tmp_path / created.id).exists())  # delivered, or let go
    status = later.finish(timeout=30)
    assert (status.sent, status.dropped) == (10, 0), status
    with pytest.raises(NotFoundError):
        server.api().run(created.id)  # not created again by the orphan's delivery
    said = [r.getMessage() for r in caplog.records if created.id in r.getMessage()]
    assert any("the run was deleted on the server" in m and "200 samples" in m for m in said)
