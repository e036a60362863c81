"""A server that accepts connections but never answers, and bursts faster than any server: the
crash-loss bound and "nothing dropped while the spool can take it" hold whatever the server does.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import noisescope
from harness.hung import HungServer
from noisescope._spool import RunSpool
from noisescope.testing import MemoryTransport as FakeServer
from tests.support.waiting import wait_for

BATCH_INTERVAL = 0.5
#: What a SIGKILLed client may lose while the server hangs, in seconds of training: the
#: documented bound (docs/client.md: batch_interval plus the guard's half and quarter
#: interval) with room for a loaded machine's scheduling; the hang itself lasts far longer.
LOSS_BOUND_S = 4 * BATCH_INTERVAL

TRAINING = f"""
BATCH_INTERVAL = {BATCH_INTERVAL}
import os, sys, time
import noisescope
url, root, run_id, progress = sys.argv[1:5]
run = noisescope.init(
    url=url, dir=root, run_id=run_id, batch_interval=BATCH_INTERVAL,
    request_timeout=120.0, resume_orphans=False,
)
fd = os.open(progress, os.O_WRONLY | os.O_CREAT, 0o644)
step = 0
started = time.time()
while True:
    run.log_sample(step, 8, 64, 2.0, 1.0)
    if step % 50 == 0:
        run.log(step, eval_loss=1.0 / (step + 1))
    os.pwrite(fd, f"{{step:012d}} {{time.time() - started:020.6f}}".encode(), 0)
    step += 1
    time.sleep(0.001)
"""


def _spooled(root: Path, run_id: str) -> tuple[set[int], set[int]]:
    """(sample seqs, event steps) in a run's spool, as a replay would read them."""
    spool = RunSpool(root, run_id)
    seqs: set[int] = set()
    event_steps: set[int] = set()
    for path in sorted((root / run_id).glob("seg-*.jsonl")):
        for record in spool.read(path):
            seqs.update(record.get("columns", {}).get("seq", []))
            event_steps.update(e["step"] for e in record.get("events", []))
    return seqs, event_steps


@pytest.mark.slow
def test_a_client_killed_while_the_server_hangs_loses_at_most_the_bound(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    progress = tmp_path / "progress"
    run_id = "hung-run"
    with HungServer() as hung:
        proc = subprocess.Popen(
            [sys.executable, "-c", TRAINING, hung.url, str(root), run_id, str(progress)],
            env={**os.environ, "NOISESCOPE_QUIET": "1"},
        )
        try:
            deadline = time.monotonic() + 60
            while not (progress.is_file() and progress.stat().st_size) and (
                time.monotonic() < deadline
            ):
                time.sleep(0.05)
            time.sleep(4.0)  # a few batch intervals of training against the hung server
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert hung.bytes_read > 0  # the client's requests reached a server that never answered
    last_step, elapsed = progress.read_text().split()
    committed = int(last_step)  # steps 0 .. last-1 were committed (the last one was open)
    steps_per_s = committed / float(elapsed)
    seqs, event_steps = _spooled(root, run_id)
    assert seqs, "nothing reached the spool while the server hung"
    assert seqs == set(range(max(seqs) + 1))  # no hole: everything older is on disk
    lost_s = (committed - 1 - max(seqs)) / steps_per_s
    assert lost_s <= LOSS_BOUND_S, (committed, max(seqs), steps_per_s)
    # evaluations (events) are under the same bound
    evals = set(range(0, committed, 50))
    assert event_steps == {s for s in evals if s <= max(event_steps)}
    lost_events_s = (max(evals) - max(event_steps)) / steps_per_s
    assert lost_events_s <= LOSS_BOUND_S, (max(evals), max(event_steps), steps_per_s)


def test_a_burst_past_memory_max_is_spilled_not_dropped(tmp_path: Path) -> None:
    """200k samples as fast as the caller can log them, default memory_max (100k), a server
    that never answers: every sample is in the spool, none dropped."""
    root = tmp_path / "spool"
    with HungServer() as hung:
        run = noisescope.init(url=hung.url, dir=root, request_timeout=60.0, flush_timeout=0.5)
        for step in range(200_000):
            run.log_sample(step, 8, 64, 2.0, 1.0)
        status = run.finish()
    assert status.dropped == 0, status
    seqs, _ = _spooled(root, run.id)
    assert seqs == set(range(200_000))


def test_a_burst_the_spool_cannot_take_says_why_and_how_many(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "spool"
    caplog.set_level(logging.WARNING, logger="noisescope")
    with HungServer() as hung:
        run = noisescope.init(
            url=hung.url, dir=root, request_timeout=60.0, flush_timeout=0.2,
            memory_max=10_000, spool_max_bytes=200_000,
        )  # fmt: skip
        for step in range(50_000):
            run.log_sample(step, 8, 64, 2.0, 1.0)
        status = run.status()
        seqs, _ = _spooled(root, run.id)
        run.finish()
    assert status.dropped > 0
    assert status.dropped + len(seqs) + status.queued >= 50_000 - 1  # the open step aside
    assert status.last_error is not None
    assert status.last_error.startswith(f"{status.dropped} samples dropped")
    assert "spool limit of 200000 bytes is reached" in status.last_error
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len([w for w in warnings if "spool limit" in w]) == 1, warnings


def test_a_burst_without_a_spool_says_why_and_how_many(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="noisescope")
    root = tmp_path / "spool"
    root.mkdir()
    (root / "no-spool").symlink_to(tmp_path, target_is_directory=True)  # refused: no spool
    with HungServer() as hung:
        run = noisescope.init(
            url=hung.url, dir=root, run_id="no-spool", request_timeout=60.0,
            flush_timeout=0.2, memory_max=10_000,
        )  # fmt: skip
        for step in range(30_000):
            run.log_sample(step, 8, 64, 2.0, 1.0)
        status = run.status()
        run.finish()
    assert status.dropped >= 30_000 - 10_000 - 1000 - 1
    assert status.last_error is not None
    assert status.last_error.startswith(
        f"{status.dropped} samples dropped because the memory buffer"
    )
    assert "there is no spool" in status.last_error
    warnings = [r.getMessage() for r in caplog.records if "memory buffer is full" in r.getMessage()]
    assert len(warnings) == 1


@pytest.mark.parametrize("mode", ["online", "offline"])
def test_evaluations_reach_the_spool_while_the_run_goes_on(tmp_path: Path, mode: str) -> None:
    """With the server down (or offline) an evaluation is on disk within the crash-loss bound,
    not only when finish() gives up."""
    root = tmp_path / "spool"
    fake = FakeServer(down=True)
    run = noisescope.init(
        transport=fake,
        dir=root,
        mode=mode,
        batch_interval=0.05,
        backoff_base=0.01,
        flush_timeout=0.2,
    )
    run.log_sample(0, 8, 64, 2.0, 1.0)
    run.log(0, eval_loss=0.5)
    assert wait_for(lambda: _spooled(root, run.id)[1] == {0})
    run.finish()
