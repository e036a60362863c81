"""A refused request costs only its own samples, counted once (issue 55 item 6): a 422 that
arrives after the guard spooled a copy of the hung request is counted by the copy's replay
alone, and a replay that merged the copy with good batches is sent again record by record, so
the refusal takes no good sample with it. A real server behind a proxy that refuses every
request holding the first batch's samples (after holding the first one past the guard)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import noisescope
from harness import ServerProcess
from harness.fault_proxy import FaultProxy, RefuseFirstBatch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess() as proc:
        yield proc


def test_a_refusal_after_the_guard_spooled_a_copy_costs_only_its_samples_once(
    server: ServerProcess, tmp_path: Path
) -> None:
    rule = RefuseFirstBatch()
    proxy = FaultProxy(server.url, answer=rule).start()
    try:
        run = noisescope.init(
            url=proxy.url, dir=tmp_path, batch_interval=0.1, batch_max=100, quiet=True,
            resume_orphans=False,
        )  # fmt: skip
        for step in range(1000):
            run.log_sample(step, 8.0, 64.0, 2.0, 1.0)
            if step == 100:  # the run is created and its spool empty: the next batch is fresh
                assert run.flush(timeout=30)
                rule.armed = True
            time.sleep(0.002)  # 2 s of training: the first refused request hangs most of it
        status = run.finish(timeout=60)
    finally:
        proxy.stop()
    refused = len(rule.poisoned)
    stored = server.api().run(run.id).n_samples
    assert 0 < refused < 1000 and rule.refusals >= 2  # the copy was refused again on replay
    assert stored == 1000 - refused, (stored, refused, status)  # every good sample stored
    assert (status.sent, status.dropped, status.spooled) == (stored, refused, 0), status
    assert status.sent + status.dropped == 1000
    assert "HTTP 422" in (status.last_error or ""), status
