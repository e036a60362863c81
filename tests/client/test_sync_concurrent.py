"""Two ``noisescope sync`` at once on one spool (issue 46, item 7): each run is delivered once,
the sync that finds a run taken by the other waits for it and then says plainly that the other
delivered it (never "no spooled run", never "a live process"), and both exit 0 when everything
ended up on the server. The syncs run as threads here: each takes its own descriptors, so the
folder locks (``flock``) exclude them as they do two processes."""

from __future__ import annotations

import contextlib
import io
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

import noisescope
from harness import AppServer
from noisescope import _spool_folder
from noisescope._spool import RunSpool
from noisescope._sync import SyncResult, report, sync, sync_run
from reliability._spool_damage import stored_seqs, write_spool
from tests.conftest import BACKENDS, app_on


@pytest.fixture(scope="module", params=BACKENDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AppServer]:
    with app_on(request.param, tmp_path_factory.mktemp("db")) as app:
        yield app


def said(result: SyncResult, root: Path) -> tuple[int, str]:
    """``noisescope sync``'s exit code and output for ``result``."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = report(result, root)
    return code, out.getvalue()


def test_two_syncs_at_once_deliver_each_run_once_and_both_exit_0(
    server: AppServer, tmp_path: Path
) -> None:
    root = tmp_path / "spool"
    runs = [write_spool(root, segments=1, per_record=50, project="two-syncs") for _ in range(6)]
    results: list[SyncResult] = []
    barrier = threading.Barrier(2)

    def one_sync() -> None:
        barrier.wait()
        results.append(sync(root, url=server.url, transport=server.transport()))

    threads = [threading.Thread(target=one_sync) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    api = server.api()
    for run in runs:
        assert sorted(stored_seqs(api, run.run_id)) == sorted(run.logged)
        assert api.run(run.run_id).status == "finished"
    assert sum(r.samples for r in results) == sum(len(run.logged) for run in runs)
    for result in results:
        assert not result.failed and not result.skipped, result
        assert sorted([*result.synced, *result.elsewhere]) == sorted(r.run_id for r in runs)
        code, output = said(result, root)
        assert code == 0, output
        assert "no spooled run" not in output and "live process" not in output
    assert not root.exists() or not list(root.iterdir())


def test_a_sync_waits_for_the_other_and_says_it_delivered_the_run(
    server: AppServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second sync finds the run held by the first (a delivery, not its live run), waits,
    and reports it as delivered by another sync once the first removed it."""
    root = tmp_path / "spool"
    run = write_spool(root, segments=1, per_record=50, project="waiting")
    waiting = threading.Event()

    def sleep(seconds: float) -> None:
        waiting.set()
        time.sleep(seconds)

    shim = SimpleNamespace(sleep=sleep, time=time.time, strftime=time.strftime, gmtime=time.gmtime)
    monkeypatch.setattr(_spool_folder, "time", shim)
    first = RunSpool.at(root, run.folder.name)
    assert first.claim(wait=False) == "taken"
    results: list[SyncResult] = []
    second = threading.Thread(
        target=lambda: results.append(sync(root, url=server.url, transport=server.transport()))
    )
    second.start()
    try:
        assert waiting.wait(60)  # the second sync is waiting for the first
        done = sync_run(first, server.transport())
        first.remove_if_empty(done.foreign)
    finally:
        first.release()
        second.join()
    [result] = results
    assert result.elsewhere == {run.folder.name: "by another sync meanwhile"}
    assert not result.failed and not result.skipped and not result.synced
    code, output = said(result, root)
    assert code == 0
    assert f"run {run.folder.name} was delivered by another sync meanwhile" in output
    assert sorted(stored_seqs(server.api(), run.run_id)) == sorted(run.logged)


def test_a_run_held_by_its_live_process_is_still_skipped_as_live(
    server: AppServer, tmp_path: Path
) -> None:
    """A sync that waits for other syncs does not wait for a live run (which may run for days)."""
    root = tmp_path / "spool"
    live = noisescope.init(project="p", mode="offline", dir=root)
    live.log_sample(0, 8, 64, 2.0, 1.0)
    assert live.flush(10)
    try:
        result = sync(root, url=server.url, transport=server.transport())
    finally:
        live.finish()
    assert result.skipped == {live.id: "in use by a live process"}
    assert said(result, root)[0] == 0
