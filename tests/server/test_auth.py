"""Projects and tokens: a token of project A can neither write nor read project B; revocation
is immediate; secrets are stored hashed and never logged. The app in this process
(harness/inprocess.py) with auth "write" and "all", on SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator

import pytest

from harness import AppServer, columns, run_body
from tests.support.database import query

API = "/api/v1"
ADMIN = "admin-secret-for-tests"


def _server(url: str, auth: str) -> Iterator[AppServer]:
    with AppServer(database_url=url, auth=auth, env={"NOISESCOPE_ADMIN_TOKEN": ADMIN}) as app:
        yield app


@pytest.fixture(scope="module")
def write_server(backend_url: str) -> Iterator[AppServer]:
    yield from _server(backend_url, "write")


def _token(server: AppServer, project: str) -> str:
    with server.client() as http:
        r = http.post(
            f"{API}/projects/{project}/tokens",
            json={"name": f"{project}-ci"},
            headers={"Authorization": f"Bearer {ADMIN}"},
        )
    assert r.status_code == 201, r.text
    secret: str = r.json()["token"]
    return secret


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def projects(write_server: AppServer) -> dict[str, str]:
    suffix = uuid.uuid4().hex[:6]
    return {name: _token(write_server, f"{name}-{suffix}") for name in ("a", "b")}


def _project(projects: dict[str, str], name: str, server: AppServer) -> str:
    with server.client() as http:
        who = http.get(f"{API}/auth/whoami", headers=_bearer(projects[name])).json()
    project: str = who["project"]
    return project


def test_writing_needs_a_token(write_server: AppServer) -> None:
    http = write_server.client()
    rid = uuid.uuid4().hex
    r = http.put(f"{API}/runs/{rid}", json=run_body())
    assert r.status_code == 401
    assert "token" in r.json()["detail"]
    r = http.put(f"{API}/runs/{rid}", json=run_body(), headers=_bearer("nsk_wrong"))
    assert r.status_code == 401
    r = http.put(
        f"{API}/runs/{rid}",
        json=run_body(),
        headers={"Authorization": "Basic abc"},
    )
    assert r.status_code == 401
    assert "Bearer" in r.json()["detail"]


def test_token_of_a_cannot_write_or_read_b(
    write_server: AppServer, projects: dict[str, str]
) -> None:
    http = write_server.client()
    proj_a = _project(projects, "a", write_server)
    proj_b = _project(projects, "b", write_server)
    run_a, run_b = uuid.uuid4().hex, uuid.uuid4().hex
    with (
        write_server.client(headers=_bearer(projects["a"])) as a,
        write_server.client(headers=_bearer(projects["b"])) as b,
    ):
        assert a.put(f"{API}/runs/{run_a}", json=run_body(project=proj_a)).status_code == 201
        assert b.put(f"{API}/runs/{run_b}", json=run_body(project=proj_b)).status_code == 201
        # A writes into B: creating a run in B, adding samples, events, status
        assert (
            a.put(f"{API}/runs/{uuid.uuid4().hex}", json=run_body(project=proj_b)).status_code
            == 403
        )
        r = a.post(f"{API}/runs/{run_b}/samples", json={"columns": columns(5)})
        assert r.status_code == 403
        assert a.post(f"{API}/runs/{run_b}/events", json={"events": []}).status_code == 403
        assert a.patch(f"{API}/runs/{run_b}", json={"status": "failed"}).status_code == 403
        assert a.post(f"{API}/runs/{run_b}/heartbeat").status_code == 403
        assert a.post(f"{API}/runs/{run_a}/heartbeat").status_code == 204
        assert http.post(f"{API}/runs/{run_a}/heartbeat").status_code == 401
        # A reads B
        assert a.get(f"{API}/runs/{run_b}").status_code == 403
        assert a.get(f"{API}/runs/{run_b}/series").status_code == 403
        assert a.get(f"{API}/runs/{run_b}/samples.csv").status_code == 403
        assert a.get(f"{API}/runs/{run_b}/recommendation").status_code == 403
        assert a.get(f"{API}/tasks/{proj_b}/task/critical-batch").status_code == 403
        assert a.get(f"{API}/runs/{run_b}/branches").status_code == 403
        assert a.get(f"{API}/tasks/{proj_b}/task/critical-batch/forecast").status_code == 403
        assert {t["project"] for t in a.get(f"{API}/tasks").json()} == {proj_a}
        assert {r["uid"] for r in a.get(f"{API}/runs").json()} == {run_a}
        assert a.get(f"{API}/projects").json() == [proj_a]
        # B's run is untouched
        assert b.get(f"{API}/runs/{run_b}").json()["n_samples"] == 0
        assert b.get(f"{API}/runs/{run_b}").json()["status"] == "running"
        # A's own writes work
        r = a.post(f"{API}/runs/{run_a}/samples", json={"columns": columns(5)})
        assert r.json()["inserted"] == 5
        assert b.post(f"{API}/runs/{run_b}/samples", json={"columns": columns(5)}).is_success
        compared = a.get(f"{API}/series", params={"runs": [run_b, run_a]}).json()
        assert [s["run_uid"] for s in compared] == [run_a]  # B's run is left out for A
    # reading without a token is open in "write" mode
    assert http.get(f"{API}/runs/{run_b}").status_code == 200


def test_revoke_takes_effect_at_once(write_server: AppServer) -> None:
    http = write_server.client()
    project = f"rev-{uuid.uuid4().hex[:6]}"
    created = http.post(f"{API}/projects/{project}/tokens", headers=_bearer(ADMIN)).json()
    rid = uuid.uuid4().hex
    headers = _bearer(created["token"])
    assert (
        http.put(f"{API}/runs/{rid}", json=run_body(project=project), headers=headers).status_code
        == 201
    )
    assert http.delete(f"{API}/tokens/{created['id']}", headers=_bearer(ADMIN)).status_code == 204
    r = http.post(f"{API}/runs/{rid}/samples", json={"columns": columns(3)}, headers=headers)
    assert r.status_code == 401
    listed = http.get(f"{API}/projects/{project}/tokens", headers=_bearer(ADMIN)).json()
    assert listed[0]["revoked_at"] is not None
    assert "token" not in listed[0]  # the secret is never shown again


def test_admin_endpoints_need_the_admin_token(write_server: AppServer) -> None:
    http = write_server.client()
    r = http.post(f"{API}/projects/x/tokens")
    assert r.status_code == 401
    r = http.get(f"{API}/projects/x/tokens", headers=_bearer("nope"))
    assert r.status_code == 401


def test_secrets_are_stored_hashed_and_never_logged(
    write_server: AppServer, projects: dict[str, str], backend_url: str
) -> None:
    secret = projects["a"]
    http = write_server.client()
    http.get(f"{API}/runs", headers=_bearer(secret))
    hashes = {r.token_hash for r in query(backend_url, "SELECT token_hash FROM token")}
    dump = " ".join(str(v) for row in query(backend_url, "SELECT * FROM token") for v in row)
    assert hashlib.sha256(secret.encode()).hexdigest() in hashes
    assert secret not in dump
    assert secret not in write_server.log()


@pytest.fixture(scope="module")
def read_server(backend_url: str) -> Iterator[AppServer]:
    yield from _server(backend_url, "all")


def test_auth_all_requires_a_token_to_read(read_server: AppServer) -> None:
    http = read_server.client()
    assert http.get(f"{API}/runs").status_code == 401
    assert http.get(f"{API}/tasks").status_code == 401
    assert http.get(f"{API}/health").status_code == 200  # liveness stays open
    token = _token(read_server, f"all-{uuid.uuid4().hex[:6]}")
    r = http.get(f"{API}/runs", headers=_bearer(token))
    assert r.status_code == 200
