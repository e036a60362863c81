"""Archive, restore, delete, rename and re-tag a run (issue 47 item 7), over HTTP and through
``noisescope.Api``, on SQLite and PostgreSQL: an archived run leaves the lists, the task
summaries, the sweep and the comparison and comes back on restore; a deleted run's rows are
gone from every table and nothing else changed; with auth on, only a token of the run's
project may change it."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from harness import AppServer, columns, run_body
from noisescope import Api, ApiError, NotFoundError, protocol
from tests.support.database import query

API = protocol.API_PREFIX
ADMIN = "admin-secret-for-run-admin-tests"
#: Every table that holds rows of a run, and the others.
RUN_TABLES = ("sample", "sample_block", "series", "event")
OTHER_TABLES = ("project", "task", "token")


def _make_run(client: TestClient, project: str, task: str = "t", n: int = 200, **extra: Any) -> str:
    uid = uuid.uuid4().hex
    assert client.put(f"{API}/runs/{uid}", json=run_body(project, task, **extra)).status_code == 201
    r = client.post(f"{API}/runs/{uid}/samples", json={"columns": columns(n)})
    assert r.status_code == 200, r.text
    events = [{"step": 10, "kind": "eval", "payload": {"loss": 1.0}, "seq": 0}]
    assert client.post(f"{API}/runs/{uid}/events", json={"events": events}).status_code == 200
    return uid


def _uids(client: TestClient, **params: Any) -> set[str]:
    r = client.get(f"{API}/runs", params={"current": "false", "limit": 10_000, **params})
    assert r.status_code == 200, r.text
    return {row["uid"] for row in r.json()}


def _counts(db_url: str, run_pk: int | None = None) -> dict[str, int]:
    """Rows per table: of one run (by its primary key) in the run tables, or in all."""
    out = {}
    for table in (*RUN_TABLES, "run", *OTHER_TABLES):
        if run_pk is not None and table in RUN_TABLES:
            sql = f"SELECT count(*) FROM {table} WHERE run_id = :pk"
            out[table] = int(query(db_url, sql, pk=run_pk)[0][0])
        elif run_pk is None:
            out[table] = int(query(db_url, f"SELECT count(*) FROM {table}")[0][0])
    return out


def _pk(db_url: str, uid: str) -> int:
    return int(query(db_url, "SELECT id FROM run WHERE uid = :uid", uid=uid)[0][0])


def test_archive_hides_the_run_everywhere_and_restore_brings_it_back(
    server: AppServer, client: TestClient
) -> None:
    project = f"arch-{uuid.uuid4().hex[:8]}"
    kept, gone = (
        _make_run(client, project, batch_size=32),
        _make_run(client, project, batch_size=64),
    )
    api = server.api()
    before = api.critical_batch(project, "t")
    assert before.n_runs + len(before.excluded) == 2
    assert api.tasks(project)[0].n_runs == 2

    api.archive_run(gone)
    assert _uids(client, project=project) == {kept}
    assert _uids(client, project=project, archived="include") == {kept, gone}
    assert _uids(client, project=project, archived="only") == {gone}
    assert {r.uid for r in api.runs(project=project, archived="only")} == {gone}
    # the run itself says so, and its job still writes to it
    archived_at = api.run(gone).archived_at
    assert archived_at is not None
    r = client.post(f"{API}/runs/{gone}/samples", json={"columns": columns(10, start=200)})
    assert r.status_code == 200 and r.json()["inserted"] == 10
    assert client.patch(f"{API}/runs/{gone}", json={"status": "finished"}).status_code == 200
    assert api.run(gone).n_samples == 210 and api.run(gone).status == "finished"
    # archiving again keeps the first time
    api.archive_run(gone)
    assert api.run(gone).archived_at == archived_at
    # task summaries, the sweep and the comparison leave it out
    (task,) = api.tasks(project)
    assert task.n_runs == 1 and task.n_samples == 200
    report = api.critical_batch(project, "t")
    mentioned = {e.uid for e in report.excluded}
    assert report.n_runs + len(report.excluded) == 1 and gone not in mentioned
    assert report.batch_sizes in ([], [32.0])
    assert {s.run_uid for s in api.compare([kept, gone])} == {kept}
    r = client.get(f"{API}/series", params={"runs": [kept, gone], "archived": "include"})
    assert {s["run_uid"] for s in r.json()} == {kept, gone}

    api.restore_run(gone)
    assert api.run(gone).archived_at is None
    assert _uids(client, project=project) == {kept, gone}
    assert api.tasks(project)[0].n_runs == 2
    after = api.critical_batch(project, "t")
    assert after.n_runs + len(after.excluded) == 2


def test_delete_removes_the_run_and_its_rows_and_nothing_else(
    server: AppServer, client: TestClient, backend_url: str
) -> None:
    project = f"del-{uuid.uuid4().hex[:8]}"
    kept, doomed = _make_run(client, project), _make_run(client, project)
    pk = _pk(backend_url, doomed)
    assert all(n > 0 for n in _counts(backend_url, pk).values())
    before = _counts(backend_url)
    of_doomed = _counts(backend_url, pk)

    assert client.delete(f"{API}/runs/{doomed}").status_code == 204
    assert _counts(backend_url, pk) == dict.fromkeys(RUN_TABLES, 0)
    after = _counts(backend_url)
    for table in RUN_TABLES:
        assert after[table] == before[table] - of_doomed[table]
    assert after["run"] == before["run"] - 1
    assert all(after[t] == before[t] for t in OTHER_TABLES)
    assert not query(backend_url, "SELECT id FROM run WHERE uid = :uid", uid=doomed)
    # every read: gone; the other run untouched
    api = server.api()
    for read in (
        lambda: api.run(doomed),
        lambda: api.series(doomed),
        lambda: api.events(doomed),
        lambda: api.samples_csv(doomed),
    ):
        with pytest.raises(NotFoundError):
            read()
    assert _uids(client, project=project, archived="include") == {kept}
    assert api.run(kept).n_samples == 200 and len(api.events(kept)) == 1
    # again, or an unknown run: 404 with a clear message, never a 5xx
    again = client.delete(f"{API}/runs/{doomed}")
    assert again.status_code == 404 and "does not exist" in again.json()["detail"]
    with pytest.raises(NotFoundError):
        api.delete_run(doomed)
    assert client.delete(f"{API}/runs/{'x' * 300}").status_code in (404, 422)


def test_rename_and_tags_with_the_limits_of_creation(server: AppServer, client: TestClient) -> None:
    uid = _make_run(client, f"edit-{uuid.uuid4().hex[:8]}", n=10, tags=["old"])
    api = server.api()
    api.rename_run(uid, "new name")
    api.set_tags(uid, ["a", "b"])
    run = api.run(uid)
    assert (run.name, run.tags) == ("new name", ["a", "b"])
    api.set_tags(uid, [])
    assert api.run(uid).tags == []
    patch = f"{API}/runs/{uid}"
    bad: list[dict[str, Any]] = [
        {"name": "x" * (protocol.MAX_NAME_LENGTH + 1)},
        {"name": "a\x00b"},
        {"name": 3},
        {"tags": ["t"] * (protocol.MAX_TAGS + 1)},
        {"tags": ["x" * (protocol.MAX_NAME_LENGTH + 1)]},
        {"tags": ["a\x00"]},
        {"tags": "a"},
        {"archived": "yes"},
        {"archived": 1},
        {"unknown": True},
    ]
    for body in bad:
        r = client.patch(patch, json=body)
        assert r.status_code == 422, (body, r.text)
        assert r.json()["detail"]
    assert client.get(f"{API}/runs", params={"archived": "all"}).status_code == 422
    run = api.run(uid)
    assert (run.name, run.tags, run.archived_at) == ("new name", [], None)
    with pytest.raises(TypeError):
        api.set_tags(uid, "ab")
    with pytest.raises(NotFoundError):
        api.rename_run(uuid.uuid4().hex, "x")


@pytest.fixture(scope="module")
def write_server(backend_url: str) -> Iterator[AppServer]:
    with AppServer(
        database_url=backend_url, auth="write", env={"NOISESCOPE_ADMIN_TOKEN": ADMIN}
    ) as app:
        yield app


def test_only_a_token_of_the_runs_project_changes_it(write_server: AppServer) -> None:
    suffix = uuid.uuid4().hex[:6]
    every = ("read", "write", "manage")  # changing a run needs manage (test_scopes.py)
    mine, other = (write_server.make_token(f"{p}-{suffix}", ADMIN, every)["token"] for p in "ab")
    with write_server.client(token=mine) as client:
        uid = _make_run(client, f"a-{suffix}", n=10)
    own, foreign, anonymous = write_server.api(mine), write_server.api(other), write_server.api()
    changes: list[Callable[[Api], None]] = [
        lambda api: api.archive_run(uid),
        lambda api: api.restore_run(uid),
        lambda api: api.rename_run(uid, "x"),
        lambda api: api.set_tags(uid, ["x"]),
        lambda api: api.delete_run(uid),
    ]
    for change in changes:
        for api, status in ((foreign, 403), (anonymous, 401)):
            with pytest.raises(ApiError) as caught:
                change(api)
            assert caught.value.status == status, caught.value
    run = own.run(uid)
    assert (run.name, run.tags, run.archived_at) == ("r", [], None)
    own.archive_run(uid)
    own.restore_run(uid)
    own.rename_run(uid, "mine")
    assert own.run(uid).name == "mine"
    own.delete_run(uid)
    with pytest.raises(NotFoundError):
        own.run(uid)
