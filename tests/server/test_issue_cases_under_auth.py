"""Issue 29's server cases (items 1, 6, 7, 8) with auth off, write and all, on SQLite and
PostgreSQL: each answers 2xx or a 4xx whose detail names the field, never a 5xx; a refusal
changes nothing stored; the server log holds no traceback.

(Items 2-4 are the read client's: tests/client/test_api_failures.py; item 5, broken bodies with
auth on: tests/server/test_body.py.)"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from harness import AppServer, columns, run_body
from harness.http_clients import HttpClient, HttpResponse

API = "/api/v1"
ADMIN = "admin-secret-for-tests"


@pytest.fixture(scope="module", params=["off", "write", "all"])
def auth_server(request: pytest.FixtureRequest, backend_url: str) -> Iterator[AppServer]:
    env = {"NOISESCOPE_ADMIN_TOKEN": ADMIN}
    with AppServer(database_url=backend_url, auth=request.param, env=env) as app:
        yield app


def _client(server: AppServer, project: str) -> TestClient:
    """A client of ``project``: with that project's token when the server checks any."""
    headers = {}
    if server.auth != "off":
        headers["Authorization"] = f"Bearer {server.make_token(project, ADMIN)['token']}"
    return server.client(prefix=API, headers=headers)


def _refused(r: HttpResponse, field: str) -> None:
    assert r.status_code == 422, (r.status_code, r.text)
    detail = r.json()["detail"]
    assert field in detail and "database" not in detail, detail


def _answered(r: HttpResponse, field: str) -> None:
    """2xx, or a 4xx naming ``field`` that does not blame the database."""
    assert r.status_code < 500, (r.status_code, r.text)
    if r.status_code >= 400:
        detail = r.json()["detail"]
        assert field in detail and "database" not in detail, detail


def _put(c: HttpClient, uid: str, project: str, **fields: Any) -> HttpResponse:
    return c.put(f"/runs/{uid}", json=run_body(project=project, task="t", **fields))


def test_the_issues_cases_answer_by_name_and_change_nothing(auth_server: AppServer) -> None:
    suffix = uuid.uuid4().hex[:8]
    project, other = f"p-{suffix}", f"q-{suffix}"
    with _client(auth_server, project) as c, _client(auth_server, other) as o:
        parent, kid, grandkid, foreign = (uuid.uuid4().hex for _ in range(4))
        assert _put(c, parent, project, batch_size=8).status_code == 201
        assert c.post(f"/runs/{parent}/samples", json={"columns": columns(200)}).status_code == 200
        assert _put(o, foreign, other, batch_size=8).status_code == 201
        before = c.get(f"/runs/{parent}").json()

        # item 1: a branch plan the reader cannot use is refused by name, nothing stored
        plan = {"branch": {"epsilon": -1, "seed": 0, "multiplier": 2, "budget": 64, "lr": 0.1}}
        _refused(
            _put(c, kid, project, batch_size=16, parent_run_id=parent, branch_step=5, config=plan),
            "config.branch.epsilon",
        )
        assert c.get(f"/runs/{kid}").status_code == 404
        assert c.get(f"/runs/{parent}/branches").status_code == 200

        # item 8: parents that could never be shown are refused by name; 2^63 - 1 is a step
        r = _put(c, kid, project, batch_size=16, parent_run_id=parent, branch_step=2**63 - 1)
        assert r.status_code == 201, r.text
        points = c.get(f"/runs/{parent}/branches").json()["points"]
        assert [p["step"] for p in points] == [2**63 - 1], points
        _refused(
            _put(c, grandkid, project, batch_size=32, parent_run_id=kid, branch_step=1),
            "parent_run_id",
        )  # a branch of a branch
        _refused(_put(c, parent, project, parent_run_id=kid, branch_step=1), "parent_run_id")
        _refused(
            _put(c, grandkid, project, batch_size=32, parent_run_id=foreign, branch_step=1),
            "parent_run_id",
        )  # a parent of another project
        assert c.get(f"/runs/{grandkid}").status_code == 404

        # item 6: arithmetic at the edges is an answer or a refusal naming the parameter
        _answered(c.get("/tasks/" + project + "/t/critical-batch/forecast?loss=1e-300"), "loss")
        _refused(
            c.get("/parallelism", params={"b_crit": 1e18, "per_device_batch": 5e-324}),
            "per_device_batch",
        )
        for when in ("9999-12-31T23:00:00-14:00", "0001-01-01T00:00:00+14:00"):
            r = c.patch(f"/runs/{parent}", json={"status": "finished", "ended_at": when})
            _refused(r, "ended_at")
        huge = columns(5, start=1000) | {"loss": [1.7e308] * 5}
        _refused(c.post(f"/runs/{parent}/samples", json={"columns": huge}), "loss")

        # item 7: a derived device limit is an answer, not a refusal
        r = c.get(
            "/parallelism",
            params={"b_crit": 1000, "per_device_batch": 1, "min_speedup": 1.0000000000000002},
        )
        assert r.status_code == 200 and "beyond 2^24" in r.json()["summary"], r.text

        after = c.get(f"/runs/{parent}").json()
        reads = [c.get(f"/runs/{parent}/{what}") for what in ("series", "events", "branches")]
    assert after["status"] == before["status"] and after["n_samples"] == before["n_samples"]
    assert after["parent_uid"] is None
    assert all(r.status_code == 200 for r in reads), [r.text for r in reads]
    log = auth_server.log()
    # every answer above was checked below 500; an unhandled error would log a traceback
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log[-3000:]
