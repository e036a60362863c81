"""Issue 46, items 9 and 11, on SQLite and PostgreSQL: names that are dot segments reach their
task, a run with per-layer series only says what it has, a run's events are read bounded (of
some kinds, at most so many, with counts by kind), and times from a client's clock ahead of
the server's are stored as the server's time, with a warning in the answer."""

from __future__ import annotations

import random
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import Engine, update
from starlette.testclient import TestClient

from harness import AppServer, columns, run_body
from harness.synthetic_sweep import make_sweep, post
from noisescope_server import crud
from noisescope_server.models import Run

API = "/api/v1"


def _put(client: TestClient, run_id: str, **body: Any) -> dict[str, Any]:
    r = client.put(f"{API}/runs/{run_id}", json=run_body(**body))
    assert r.status_code == 201, r.text
    answer: dict[str, Any] = r.json()
    return answer


# --- item 9 (a): "." and ".." as names ---------------------------------------------------


def test_dot_segment_names_reach_their_task_through_the_client(
    server: AppServer, client: TestClient
) -> None:
    """``Api.critical_batch`` spells "." and ".." as %2E segments: an HTTP library that removes
    dot segments (requests, httpx) would otherwise send ``/tasks/./../critical-batch`` to
    another route, a 404."""
    project = f"dots-{uuid.uuid4().hex[:8]}"
    for i, (p, t) in enumerate(((".", ".."), ("..", "."), (project, ".."))):
        post(client, make_sweep(200.0, (32, 128, 512), rng=random.Random(i)), project=p, task=t)
    api = server.api()
    for p, t in ((".", ".."), ("..", "."), (project, "..")):
        report = api.critical_batch(p, t)
        assert (report.project, report.task) == (p, t)
        assert report.batch_sizes == [32.0, 128.0, 512.0]
        forecast = api.critical_batch_forecast(p, t)
        assert (forecast.project, forecast.task) == (p, t)
        assert {r.task for r in api.runs(project=p, current=False)} >= {t}


# --- item 9 (c): a run with per-layer series only --------------------------------------


def test_a_run_with_layer_series_only_says_what_it_has(
    server: AppServer, client: TestClient, run_id: str
) -> None:
    _put(client, run_id, project=f"layers-{uuid.uuid4().hex[:8]}")
    seq = 0
    for layer in range(3):
        cols = columns(100, start=seq, series=f"layer.{layer}")
        cols["step"] = list(range(100))  # each layer at the same steps 0..99
        seq += 100
        r = client.post(f"{API}/runs/{run_id}/samples", json={"columns": cols})
        assert r.status_code == 200, r.text
    run = server.api().run(run_id)
    assert run.n_samples == 0 and run.b_simple is None  # the whole model's: none logged
    reason = run.b_simple_reason or ""
    assert "no samples yet" not in reason
    assert "3 per-layer series (300 samples)" in reason and 'series ""' in reason
    assert f"/runs/{run_id}/series?series=NAME" in reason
    assert run.last_step == 99  # the layers' steps count
    (listed,) = server.api().runs(project=run.project)
    assert listed.b_simple_reason == reason
    names = [s.name for s in server.api().series_names(run_id)]
    assert names == ["layer.0", "layer.1", "layer.2"]


def test_a_run_without_any_sample_still_says_no_samples_yet(
    server: AppServer, client: TestClient, run_id: str
) -> None:
    _put(client, run_id, project=f"empty-{uuid.uuid4().hex[:8]}")
    assert server.api().run(run_id).b_simple_reason == "no samples yet"


# --- item 9 (d): a run's events, bounded ------------------------------------------------


def test_events_of_some_kinds_at_most_so_many_with_counts(
    server: AppServer, client: TestClient, run_id: str
) -> None:
    _put(client, run_id, project=f"events-{uuid.uuid4().hex[:8]}")
    events = [
        {"step": i, "kind": "eval" if i % 2 else "checkpoint", "payload": {"loss": 1.0 / (i + 1)}}
        for i in range(1000)
    ] + [{"step": 500, "kind": "batch_size", "payload": {"batch_size": 64}}]
    r = client.post(f"{API}/runs/{run_id}/events", json={"events": events})
    assert r.status_code == 200, r.text
    api = server.api()
    assert api.event_counts(run_id) == {"batch_size": 1, "checkpoint": 500, "eval": 500}
    assert len(api.events(run_id)) == 1001  # no bound asked: every event, as before
    evals = api.events(run_id, kinds=["eval"], max_events=120)
    # every k-th from the first, k = ceil(500 / 120) = 5: 100 events over the whole run
    assert [e.step for e in evals] == list(range(1, 1000, 10))
    assert {e.kind for e in evals} == {"eval"}
    marks = api.events(run_id, exclude_kinds=["eval", "notice"], max_events=1000)
    assert len(marks) == 501 and {e.kind for e in marks} == {"checkpoint", "batch_size"}
    assert [e.step for e in marks] == sorted(e.step for e in marks)
    assert api.events(run_id, kinds=[]) == []
    assert len(api.events(run_id, kinds=["eval", "batch_size"], max_events=1)) == 1
    r = client.get(f"{API}/runs/{run_id}/events", params={"max_events": 0})
    assert r.status_code == 422 and "max_events" in r.text


# --- item 11: clock skew ----------------------------------------------------------------


def test_times_ahead_of_the_server_clock_are_stored_as_its_time(
    server: AppServer, client: TestClient, run_id: str
) -> None:
    project = f"skew-{uuid.uuid4().hex[:8]}"
    ahead = datetime.now(timezone.utc) + timedelta(days=1)
    answer = _put(client, run_id, project=project, started_at=ahead.isoformat())
    (warning,) = answer["warnings"]
    assert warning.startswith("started_at ") and "24.0 hours ahead of the server's clock" in warning
    run = server.api().run(run_id)
    assert run.started_at is not None
    assert abs(run.started_at - datetime.now(timezone.utc)) < timedelta(minutes=1)
    # a re-PUT keeps the first started_at and has nothing to say
    again = client.put(
        f"{API}/runs/{run_id}", json=run_body(project=project, started_at=ahead.isoformat())
    )
    assert again.status_code == 200 and again.json()["warnings"] == []
    r = client.patch(
        f"{API}/runs/{run_id}", json={"status": "finished", "ended_at": ahead.isoformat()}
    )
    assert r.status_code == 200, r.text
    (warning,) = r.json()["warnings"]
    assert warning.startswith("ended_at ") and "ahead of the server's clock" in warning
    ended = server.api().run(run_id).ended_at
    assert ended is not None and ended < datetime.now(timezone.utc) + timedelta(seconds=5)


def test_times_within_the_tolerance_are_stored_as_sent(
    server: AppServer, client: TestClient, run_id: str
) -> None:
    soon = datetime.now(timezone.utc) + crud.FUTURE_TOLERANCE / 2
    answer = _put(
        client, run_id, project=f"skew-{uuid.uuid4().hex[:8]}", started_at=soon.isoformat()
    )
    assert answer["warnings"] == []
    started = server.api().run(run_id).started_at
    assert started is not None and abs(started - soon) < timedelta(milliseconds=1)


def test_a_row_stored_in_the_future_does_not_sort_as_the_newest(
    server: AppServer, client: TestClient, engine: Engine
) -> None:
    """Rows written before the clamp keep their time; the run list orders them by when the
    server last heard from them."""
    project = f"skew-{uuid.uuid4().hex[:8]}"
    old, skewed, new = (uuid.uuid4().hex for _ in range(3))
    for uid in (old, skewed, new):
        _put(client, uid, project=project)
    with engine.begin() as conn:  # as an older server stored a skewed client's run
        conn.execute(
            update(Run)
            .where(Run.uid == skewed)
            .values(started_at=datetime.now(timezone.utc) + timedelta(days=1))
        )
    listed = [r.uid for r in server.api().runs(project=project, current=False)]
    assert listed == [new, skewed, old]
