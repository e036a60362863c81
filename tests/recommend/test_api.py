"""GET /api/v1/runs/{run_id}/recommendation through the server's app (in this process:
harness/inprocess.py), on SQLite and PostgreSQL.

Samples go in through the real client (``noisescope.init``, its sender thread, over the
in-process transport), batch-size changes through the real scheduler (``Run.log_event``); the
answer is checked against hand-computed values.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

import noisescope
from harness import AppServer
from noisescope.recommend import recommend
from noisescope.schedule import BatchSizeScheduler

G_SQ, TRACE_SIGMA = 2.0, 300.0  # B_simple = 150


@pytest.fixture
def server(db_url: str) -> Iterator[AppServer]:
    with AppServer(database_url=db_url) as srv:
        yield srv


def _log_run(server: AppServer, tmp: str, *, with_schedule: bool) -> str:
    run = noisescope.init(
        server.url,
        project="p",
        task="t",
        batch_size=32,
        dir=tmp,
        quiet=True,
        flush_timeout=30,
        transport=server.transport(),
    )
    sched = BatchSizeScheduler(
        micro_batch_size=8, max_batch_size=512, warmup_steps=5, cooldown_steps=5, run=run
    )
    for step in range(300):
        wobble = 1.0 + 0.01 * math.sin(step)  # exact eq. 1 norms, a little spread
        b_big = 32
        small = (G_SQ + TRACE_SIGMA / 8) * wobble
        big = (G_SQ + TRACE_SIGMA / b_big) * wobble
        run.log_sample(step, 8, b_big, small, big)
        if with_schedule:
            sched.update(step, 150.0)
    assert run.flush(30)
    run.finish()
    if with_schedule:
        assert sched.batch_size == 128  # 16 -> 32 -> 64 -> 128, then inside the band
    return run.id


def test_recommendation_from_stored_samples(server: AppServer, tmp_path: object) -> None:
    run_id = _log_run(server, str(tmp_path), with_schedule=True)
    _check_scheduled_run(server, run_id)
    # one server per backend: the second case uses it too
    _check_fallbacks_and_errors(server, _log_run(server, str(tmp_path), with_schedule=False))


def _check_scheduled_run(server: AppServer, run_id: str) -> None:
    with server.client() as http:
        events = http.get(f"/api/v1/runs/{run_id}/events").json()
        assert [e["payload"]["batch_size"] for e in events] == [32, 64, 128]
        assert all(e["kind"] == "batch_size" for e in events)
        r = http.get(
            f"/api/v1/runs/{run_id}/recommendation",
            params=[
                ("candidates", "75"),
                ("candidates", "300"),
                ("throughput", "32:1000"),
                ("throughput", "128:3000"),
                ("throughput", "512:4000"),
            ],
        )
        assert r.status_code == 200, r.text
        body = r.json()
    assert body["batch_size_source"] == "event"  # the scheduler's latest change
    rec = body["recommendation"]
    assert rec["batch_size"] == 128
    b = rec["b_simple"]
    assert b == pytest.approx(150.0, rel=0.02)
    assert rec["b_simple_lo"] <= b <= rec["b_simple_hi"]
    cur = rec["current"]
    assert cur["steps_ratio"] == pytest.approx(1 + b / 128)
    assert cur["examples_ratio"] == pytest.approx(1 + 128 / b)
    assert cur["efficiency"] == pytest.approx(b / (b + 128))
    by_b = {o["batch_size"]: o for o in rec["options"]}
    assert set(by_b) == {32, 75, 128, 300, 512}
    assert by_b[75]["steps_ratio"] == pytest.approx(1 + b / 75)
    # goodput = throughput x phi/(phi + B): 128 -> 3000*150/278 beats 512 -> 4000*150/662
    assert by_b[128]["goodput"] == pytest.approx(3000 * b / (b + 128))
    assert by_b[512]["goodput"] == pytest.approx(4000 * b / (b + 512))
    assert rec["goodput_batch_size"] == 128
    # the route is recommend() on the run's summary: the same answer, built in this process
    throughput = {32.0: 1000.0, 128.0: 3000.0, 512.0: 4000.0}
    with server.api() as api:
        local = recommend(api.run(run_id), 128, candidates=[75, 300], throughput=throughput)
        remote = api.recommendation(run_id, candidates=[75, 300], throughput=throughput)
    assert remote.recommendation == local


def _check_fallbacks_and_errors(server: AppServer, run_id: str) -> None:
    with server.client() as http:
        r = http.get(f"/api/v1/runs/{run_id}/recommendation")
        assert r.status_code == 200, r.text
        assert r.json()["batch_size_source"] == "run"
        assert r.json()["recommendation"]["batch_size"] == 32
        r = http.get(f"/api/v1/runs/{run_id}/recommendation", params={"batch_size": 300})
        assert r.json()["batch_size_source"] == "query"
        assert r.json()["recommendation"]["current"]["examples_ratio"] == pytest.approx(
            1 + 300 / r.json()["recommendation"]["b_simple"]
        )
        bad = http.get(f"/api/v1/runs/{run_id}/recommendation", params={"throughput": "64-9"})
        assert bad.status_code == 422
        assert "BATCH:PER_SECOND" in bad.json()["detail"]
        bad = http.get(f"/api/v1/runs/{run_id}/recommendation", params={"batch_size": -1})
        assert bad.status_code == 422
        assert "batch_size" in bad.json()["detail"]
        # recommend() checks every number, so the route refuses what it would refuse, by name
        for params, named in (
            ({"batch_size": "inf"}, "batch_size must be a finite positive number"),
            ({"candidates": ["64", "nan"]}, "candidates must be a finite positive number"),
            ({"throughput": "64:inf"}, "throughput must be a finite positive number"),
            ({"throughput": "0:10"}, "throughput batch size must be a finite positive"),
            ({"reference_batch": "inf"}, "reference_batch must be a finite number >= 0"),
        ):
            bad = http.get(f"/api/v1/runs/{run_id}/recommendation", params=params)
            assert bad.status_code == 422 and named in bad.json()["detail"], (params, bad.text)
        missing = http.get("/api/v1/runs/0123abcd/recommendation")
        assert missing.status_code == 404
