"""Batch-size events reach the server through Run.log_event, also after an outage."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

import noisescope
from harness import ServerProcess
from noisescope.schedule import BatchSizeScheduler


def test_events_logged_while_the_server_is_down_arrive_once_it_is_up(tmp_path: Path) -> None:
    server = ServerProcess()  # port chosen, not started yet: the first requests fail
    try:
        run = noisescope.init(
            server.url, project="p", task="t", dir=str(tmp_path), quiet=True, backoff_base=0.05
        )
        sched = BatchSizeScheduler(
            micro_batch_size=8, max_batch_size=512, warmup_steps=0, cooldown_steps=1, run=run
        )
        for step in range(10):
            run.log_sample(step, 8, 16, 2.0, 1.5)
            sched.update(step, 400.0)
        assert [d.batch_size for d in sched.decisions] == [32, 64, 128, 256, 400]
        deadline = time.monotonic() + 30
        while run.status().last_error is None and time.monotonic() < deadline:
            time.sleep(0.05)  # wait until the sender has met the outage
        assert run.status().last_error is not None
        server.start()
        assert run.flush(60)
        run.finish()
        events = httpx.get(f"{server.url}/api/v1/runs/{run.id}/events", timeout=30).json()
        assert [(e["step"], e["payload"]["batch_size"]) for e in events] == [
            (d.step, d.batch_size) for d in sched.decisions
        ]
        assert [e["seq"] for e in events] == [0, 1, 2, 3, 4]
    finally:
        server.close()
