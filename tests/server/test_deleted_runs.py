"""Deleted runs stay deleted (issue 55 item 2) and a change made on the server wins over a
job's run body (item 3), through a real server process on SQLite and PostgreSQL: every write
to a deleted run's id answers 410 Gone with the server's usual ``{"detail": ...}`` naming
what to do, reads answer 404, no row comes back; ingest racing a delete stores nothing after
it; reusing the id is a PUT with ``?reuse_deleted=true`` and the ``manage`` scope; a name and
tags set by PATCH survive the job's re-sent PUT, which says so in its ``warnings``."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import httpx
import pytest

from harness import ServerProcess, columns, run_body
from noisescope import protocol
from reliability._infra import create_token
from tests.support.database import query

API = protocol.API_PREFIX
PROJECT = "gone"


@pytest.fixture(scope="module")
def served(backend_url: str) -> Iterator[ServerProcess]:
    with ServerProcess(database_url=backend_url, auth="write") as proc:
        yield proc


@pytest.fixture(scope="module")
def job_token(served: ServerProcess) -> str:
    """A training job's token (the default scopes: read, write)."""
    return create_token(served.database_url, PROJECT)


@pytest.fixture(scope="module")
def admin_token(served: ServerProcess) -> str:
    return create_token(served.database_url, PROJECT, "read,write,manage")


def _gone(answer: httpx.Response, uid: str) -> None:
    assert answer.status_code == 410, answer.text
    (detail,) = answer.json().values()
    assert f"run {uid!r} was deleted at " in detail
    assert f"PUT {API}/runs/{uid}?reuse_deleted=true" in detail and "'manage'" in detail


def _rows(db_url: str, uid: str) -> int:
    return int(query(db_url, "SELECT count(*) FROM run WHERE uid = :u", u=uid)[0][0])


def test_every_write_to_a_deleted_run_is_gone_and_nothing_comes_back(
    served: ServerProcess, job_token: str, admin_token: str
) -> None:
    uid = uuid.uuid4().hex
    with served.client(job_token) as job, served.client(admin_token) as admin:
        assert job.put(f"{API}/runs/{uid}", json=run_body(PROJECT)).status_code == 201
        assert job.post(f"{API}/runs/{uid}/samples", json={"columns": columns(50)}).is_success
        assert admin.delete(f"{API}/runs/{uid}").status_code == 204
        _gone(job.put(f"{API}/runs/{uid}", json=run_body(PROJECT)), uid)
        _gone(job.post(f"{API}/runs/{uid}/samples", json={"columns": columns(100)}), uid)
        _gone(
            job.post(f"{API}/runs/{uid}/events", json={"events": [{"step": 1, "kind": "m"}]}), uid
        )
        _gone(job.post(f"{API}/runs/{uid}/heartbeat"), uid)
        _gone(job.patch(f"{API}/runs/{uid}", json={"status": "finished"}), uid)
        _gone(admin.patch(f"{API}/runs/{uid}", json={"name": "x"}), uid)
        read = job.get(f"{API}/runs/{uid}")
        assert read.status_code == 404, read.text
        again = admin.delete(f"{API}/runs/{uid}")
        assert again.status_code == 404 and "it was deleted at" in again.json()["detail"]
    assert _rows(served.database_url, uid) == 0


def test_reusing_a_deleted_id_is_explicit_and_needs_manage(
    served: ServerProcess, job_token: str, admin_token: str
) -> None:
    uid = uuid.uuid4().hex
    reuse = f"{API}/runs/{uid}?reuse_deleted=true"
    with served.client(job_token) as job, served.client(admin_token) as admin:
        assert job.put(f"{API}/runs/{uid}", json=run_body(PROJECT)).status_code == 201
        assert job.post(f"{API}/runs/{uid}/samples", json={"columns": columns(30)}).is_success
        assert admin.delete(f"{API}/runs/{uid}").status_code == 204
        refused = job.put(reuse, json=run_body(PROJECT))
        assert refused.status_code == 403 and "'manage' scope" in refused.json()["detail"]
        # a manager of another project cannot take the id over
        other = create_token(served.database_url, "other-project", "read,write,manage")
        with served.client(other) as stranger:
            _gone(stranger.put(reuse, json=run_body("other-project")), uid)
        made = admin.put(reuse, json=run_body(PROJECT, name="second"))
        assert made.status_code == 201, made.text
        # a fresh run: the job's writes go in again, none of the first life's samples are back
        r = job.post(f"{API}/runs/{uid}/samples", json={"columns": columns(10)})
        assert r.json()["inserted"] == 10
        run = job.get(f"{API}/runs/{uid}").json()
        assert (run["name"], run["n_samples"]) == ("second", 10)
        # the flag on a live run changes nothing more than a plain PUT
        assert admin.put(reuse, json=run_body(PROJECT, name="second")).status_code == 200
    assert _rows(served.database_url, uid) == 1


def test_ingest_racing_a_delete_stores_nothing_after_it(
    served: ServerProcess, job_token: str, admin_token: str
) -> None:
    """A job sends batches while the run is deleted: each batch is either stored before the
    delete (and deleted with the run) or refused with 410 after it; none re-creates the run."""
    uid = uuid.uuid4().hex
    answers: list[int] = []
    deleted = threading.Event()

    def job() -> None:
        with served.client(job_token) as http:
            assert http.put(f"{API}/runs/{uid}", json=run_body(PROJECT)).status_code == 201
            for batch in range(10_000):  # until the delete lands: then 410, and the job stops
                body = {"columns": columns(50, start=batch * 50)}
                answers.append(http.post(f"{API}/runs/{uid}/samples", json=body).status_code)
                if batch == 10:
                    deleted.set()
                if answers[-1] != 200:
                    break

    sender = threading.Thread(target=job)
    sender.start()
    assert deleted.wait(60)
    with served.client(admin_token) as admin:
        assert admin.delete(f"{API}/runs/{uid}").status_code == 204
    sender.join(120)
    assert set(answers[:-1]) == {200} and answers[-1] == 410, answers
    with served.client(job_token) as http:  # once gone, always gone
        late = http.post(f"{API}/runs/{uid}/samples", json={"columns": columns(5)})
        assert late.status_code == 410
    assert _rows(served.database_url, uid) == 0
    pk_rows = query(served.database_url, "SELECT count(*) FROM deleted_run WHERE uid = :u", u=uid)
    assert pk_rows[0][0] == 1


def test_a_name_and_tags_set_on_the_server_survive_the_jobs_put(
    served: ServerProcess, job_token: str, admin_token: str
) -> None:
    uid = uuid.uuid4().hex
    with served.client(job_token) as job, served.client(admin_token) as admin:
        body = run_body(PROJECT, name="job-name", tags=["from-job"], batch_size=64)
        assert job.put(f"{API}/runs/{uid}", json=body).json()["warnings"] == []
        assert admin.patch(f"{API}/runs/{uid}", json={"name": "mine"}).is_success
        assert admin.patch(f"{API}/runs/{uid}", json={"tags": ["kept"]}).is_success
        # the job's replayed body (a reconnect, or `noisescope sync` of its spool), with a
        # field of its own changed: its field is applied, the name and tags stay
        replay = job.put(f"{API}/runs/{uid}", json={**body, "batch_size": 128})
        assert replay.status_code == 200, replay.text
        warnings = replay.json()["warnings"]
        assert len(warnings) == 2 and "name kept as 'mine'" in warnings[0]
        assert "tags kept as ['kept']" in warnings[1]
        run = job.get(f"{API}/runs/{uid}").json()
        assert (run["name"], run["tags"], run["batch_size"]) == ("mine", ["kept"], 128)
        # the same body again once the job agrees: no warning
        agreed = job.put(f"{API}/runs/{uid}", json={**body, "name": "mine", "tags": ["kept"]})
        assert agreed.json()["warnings"] == []
        # a later PATCH still changes it
        assert admin.patch(f"{API}/runs/{uid}", json={"name": "third"}).is_success
        assert job.get(f"{API}/runs/{uid}").json()["name"] == "third"


def test_a_put_without_a_patch_still_sets_name_and_tags(
    served: ServerProcess, job_token: str
) -> None:
    """Only fields changed on the server are kept: a job's own re-PUT renames its run."""
    uid = uuid.uuid4().hex
    with served.client(job_token) as job:
        assert job.put(f"{API}/runs/{uid}", json=run_body(PROJECT, name="a")).status_code == 201
        again = job.put(f"{API}/runs/{uid}", json=run_body(PROJECT, name="b", tags=["t"]))
        assert again.json()["warnings"] == []
        run = job.get(f"{API}/runs/{uid}").json()
    assert (run["name"], run["tags"]) == ("b", ["t"])


def test_the_410_in_the_docs_is_the_servers(
    served: ServerProcess, job_token: str, admin_token: str
) -> None:
    """docs/api.md's 410 example is what a server answers, but for the run id and the time."""
    import json
    import re
    from pathlib import Path

    uid = uuid.uuid4().hex
    with served.client(job_token) as job, served.client(admin_token) as admin:
        assert job.put(f"{API}/runs/{uid}", json=run_body(PROJECT)).status_code == 201
        assert admin.delete(f"{API}/runs/{uid}").status_code == 204
        answer = job.post(f"{API}/runs/{uid}/heartbeat")
    text = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    blocks = re.findall(r"```json\n(.*?)```", text, flags=re.S)
    (block,) = [b for b in blocks if "reuse_deleted=true with a token" in b]
    documented = json.loads(block)["detail"]
    when = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00")
    said = when.sub("T", answer.json()["detail"]).replace(uid, "c0ffee...")
    assert answer.status_code == 410 and said == when.sub("T", documented)
