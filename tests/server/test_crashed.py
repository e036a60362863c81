"""Heartbeats and crashed runs: a run still "running" that the server has not heard from for
``crash_after`` seconds reads "crashed" everywhere; any write or a heartbeat makes it read
"running" again. Computed at read time, nothing written."""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta, timezone

import httpx
import pytest
from sqlalchemy import Engine, select, update
from starlette.testclient import TestClient

from harness import ServerProcess, columns, run_body
from noisescope import _wire
from noisescope_server.models import Run

API = "/api/v1"


def _silence(engine: Engine, rid: str, seconds: float) -> None:
    """Make the run's last sign of life ``seconds`` old, as if its process had died then."""
    then = datetime.now(timezone.utc) - timedelta(seconds=seconds)
    with engine.begin() as conn:
        conn.execute(update(Run).where(Run.uid == rid).values(last_seen_at=then))


def _last_seen(engine: Engine, rid: str) -> datetime:
    with engine.connect() as conn:
        value = conn.execute(select(Run.last_seen_at).where(Run.uid == rid)).scalar_one()
    assert value is not None
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value


def _status(client: TestClient, rid: str) -> str:
    status: str = client.get(f"{API}/runs/{rid}").json()["status"]
    return status


def test_a_silent_running_run_reads_crashed_everywhere(client: TestClient, engine: Engine) -> None:
    project = f"crash-{uuid.uuid4().hex[:8]}"
    silent, alive, done = (uuid.uuid4().hex for _ in range(3))
    for rid in (silent, alive, done):
        client.put(f"{API}/runs/{rid}", json=run_body(project=project)).raise_for_status()
    client.patch(f"{API}/runs/{done}", json={"status": "finished"}).raise_for_status()
    for rid in (silent, done):
        _silence(engine, rid, _wire.CRASH_AFTER + 60)

    assert _status(client, silent) == "crashed"
    assert _status(client, alive) == "running"
    assert _status(client, done) == "finished"  # only running runs crash
    listed = {r["uid"]: r["status"] for r in client.get(f"{API}/runs?project={project}").json()}
    assert listed == {silent: "crashed", alive: "running", done: "finished"}
    crashed = client.get(f"{API}/runs", params={"project": project, "status": "crashed"}).json()
    assert [r["uid"] for r in crashed] == [silent]
    running = client.get(f"{API}/runs", params={"project": project, "status": "running"}).json()
    assert [r["uid"] for r in running] == [alive]
    (task,) = [t for t in client.get(f"{API}/tasks").json() if t["project"] == project]
    assert task["n_running"] == 1
    sweep = client.get(f"{API}/tasks/{project}/task/critical-batch")
    assert sweep.status_code == 200
    assert client.get(f"{API}/runs/{silent}").json()["last_seen_at"] is not None


def test_a_heartbeat_brings_it_back_and_changes_nothing_else(
    client: TestClient, engine: Engine
) -> None:
    rid = uuid.uuid4().hex
    client.put(f"{API}/runs/{rid}", json=run_body()).raise_for_status()
    before = client.get(f"{API}/runs/{rid}").json()
    _silence(engine, rid, _wire.CRASH_AFTER + 60)
    assert _status(client, rid) == "crashed"
    r = client.post(f"{API}/runs/{rid}/heartbeat")
    assert r.status_code == 204 and r.content == b""
    after = client.get(f"{API}/runs/{rid}").json()
    assert after["status"] == "running"
    changed = {k for k in before if before[k] != after[k]}
    assert changed == {"last_seen_at"}


def test_heartbeat_errors(client: TestClient, run_id: str) -> None:
    r = client.post(f"{API}/runs/{run_id}/heartbeat")
    assert r.status_code == 404 and "does not exist" in r.json()["detail"]
    client.put(f"{API}/runs/{run_id}", json=run_body()).raise_for_status()
    r = client.post(f"{API}/runs/{run_id}/heartbeat", content=b'{"alive": true}')
    assert r.status_code == 422 and "no body" in r.json()["detail"]
    assert client.post(f"{API}/runs/{run_id}/heartbeat", json={}).status_code == 204
    assert client.get(f"{API}/runs/{run_id}/heartbeat").status_code == 405


@pytest.mark.parametrize(
    "write",
    ["put", "patch", "samples", "resent samples", "empty samples", "events", "no events"],
)
def test_every_write_refreshes_last_seen(client: TestClient, engine: Engine, write: str) -> None:
    rid = uuid.uuid4().hex
    client.put(f"{API}/runs/{rid}", json=run_body()).raise_for_status()
    cols = columns(5)
    client.post(f"{API}/runs/{rid}/samples", json={"columns": cols}).raise_for_status()
    _silence(engine, rid, 3600)
    stale = _last_seen(engine, rid)
    requests = {
        "put": lambda: client.put(f"{API}/runs/{rid}", json=run_body()),
        "patch": lambda: client.patch(f"{API}/runs/{rid}", json={"batch_size": 64}),
        "samples": lambda: client.post(
            f"{API}/runs/{rid}/samples", json={"columns": columns(5, start=5)}
        ),
        "resent samples": lambda: client.post(f"{API}/runs/{rid}/samples", json={"columns": cols}),
        "empty samples": lambda: client.post(
            f"{API}/runs/{rid}/samples", json={"columns": columns(0)}
        ),
        "events": lambda: client.post(
            f"{API}/runs/{rid}/events", json={"events": [{"step": 1, "kind": "m"}]}
        ),
        "no events": lambda: client.post(f"{API}/runs/{rid}/events", json={"events": []}),
    }
    assert requests[write]().is_success
    assert _last_seen(engine, rid) > stale + timedelta(seconds=3000)
    assert _status(client, rid) == "running"


def test_a_small_crash_after_on_a_real_server() -> None:
    """NOISESCOPE_CRASH_AFTER=1: a run that stops sending reads crashed once a second has
    passed without a sign of life, and running again after its next heartbeat."""
    with ServerProcess(env={"NOISESCOPE_CRASH_AFTER": "1"}) as srv:
        rid = uuid.uuid4().hex
        with httpx.Client(base_url=srv.url + API) as c:
            c.put(f"/runs/{rid}", json=run_body()).raise_for_status()
            time.sleep(1.5)  # longer than crash_after: the run has gone silent
            assert c.get(f"/runs/{rid}").json()["status"] == "crashed"
            assert [r["uid"] for r in c.get("/runs", params={"status": "crashed"}).json()] == [rid]
            assert c.post(f"/runs/{rid}/heartbeat").status_code == 204
            c.patch(f"/runs/{rid}", json={"status": "finished"}).raise_for_status()
            time.sleep(1.5)
            assert c.get(f"/runs/{rid}").json()["status"] == "finished"


def test_crash_after_must_be_positive() -> None:
    from noisescope_server.settings import Settings

    with pytest.raises(ValueError, match="crash_after"):
        Settings.from_env({"NOISESCOPE_CRASH_AFTER": "0"})
    with pytest.raises(ValueError, match="NOISESCOPE_CRASH_AFTER"):
        Settings.from_env({"NOISESCOPE_CRASH_AFTER": "soon"})
    assert Settings.from_env({"NOISESCOPE_CRASH_AFTER": "30"}).crash_after == 30.0
    assert Settings.from_env({}).crash_after == _wire.CRASH_AFTER
