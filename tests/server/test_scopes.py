"""Token scopes (issue 55 item 1) through a real server process with ``--auth all``, on SQLite
and PostgreSQL: a ``read`` token reads and changes nothing, a ``write`` token (the default, a
job's) ingests but cannot rename, tag, archive or delete, a ``manage`` token changes runs; every
403 names the scope it lacks and the command that makes a token with it; tokens stored before
scopes existed (revision 0004) keep reading and ingesting after the upgrade and are refused,
with that message, what only ``manage`` may do."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from harness import ServerProcess, columns, run_body
from harness.old_rows import OLD_SECRET, dump, populate
from noisescope import protocol
from noisescope_server import db
from reliability._infra import create_token
from tests.conftest import BACKENDS, fresh_database

API = protocol.API_PREFIX
PROJECT = "scoped"


@pytest.fixture(scope="module")
def locked(backend_url: str) -> Iterator[ServerProcess]:
    """A real server with ``--auth all`` (every request needs a token)."""
    with ServerProcess(database_url=backend_url, auth="all") as proc:
        yield proc


@pytest.fixture(scope="module")
def tokens(locked: ServerProcess) -> dict[str, str]:
    """Secrets by what ``noisescope token create`` was given: no --scope, read, manage."""
    url = locked.database_url
    return {
        "default": create_token(url, PROJECT),
        "read": create_token(url, PROJECT, "read"),
        "manage": create_token(url, PROJECT, "read,manage"),
    }


def _new_run(server: ServerProcess, token: str, n: int = 20) -> str:
    uid = uuid.uuid4().hex
    with server.client(token) as http:
        assert http.put(f"{API}/runs/{uid}", json=run_body(PROJECT, "t")).status_code == 201
        r = http.post(f"{API}/runs/{uid}/samples", json={"columns": columns(n)})
        assert r.status_code == 200, r.text
    return uid


def _refused(answer: httpx.Response, scope: str) -> None:
    """A 403 whose body, the server's usual ``{"detail": ...}``, names the missing scope and
    the command that makes a token with it."""
    assert answer.status_code == 403, answer.text
    (detail,) = answer.json().values()
    assert f"lacks the {scope!r} scope" in detail
    assert f"noisescope token create --project {PROJECT} --scope {scope}" in detail


def test_a_read_token_reads_and_changes_nothing(
    locked: ServerProcess, tokens: dict[str, str]
) -> None:
    uid = _new_run(locked, tokens["default"])
    with locked.client(tokens["read"]) as http:
        assert http.get(f"{API}/runs/{uid}").status_code == 200
        assert http.get(f"{API}/runs/{uid}/series").status_code == 200
        _refused(http.put(f"{API}/runs/{uid}", json=run_body(PROJECT, "t")), "write")
        _refused(http.post(f"{API}/runs/{uid}/samples", json={"columns": columns(5)}), "write")
        _refused(http.post(f"{API}/runs/{uid}/heartbeat"), "write")
        _refused(http.patch(f"{API}/runs/{uid}", json={"status": "finished"}), "write")
        for change in ({"name": "x"}, {"tags": ["x"]}, {"archived": True}):
            _refused(http.patch(f"{API}/runs/{uid}", json=change), "manage")
        _refused(http.delete(f"{API}/runs/{uid}"), "manage")
        who = http.get(f"{API}/auth/whoami").json()
    assert who["scopes"] == ["read"]
    access = locked.api(tokens["read"]).access()  # noisescope.Api's view of it
    assert (access.scopes, access.project, access.auth) == (["read"], PROJECT, "all")
    with locked.client(tokens["default"]) as http:  # nothing changed
        run = http.get(f"{API}/runs/{uid}").json()
    assert (run["name"], run["tags"], run["n_samples"], run["status"]) == ("r", [], 20, "running")


def test_the_default_token_ingests_and_cannot_manage(
    locked: ServerProcess, tokens: dict[str, str]
) -> None:
    uid = _new_run(locked, tokens["default"])
    with locked.client(tokens["default"]) as http:
        events = {"events": [{"step": 1, "kind": "mark", "seq": 0}]}
        assert http.post(f"{API}/runs/{uid}/events", json=events).status_code == 200
        assert http.post(f"{API}/runs/{uid}/heartbeat").status_code == 204
        assert http.patch(f"{API}/runs/{uid}", json={"status": "finished"}).status_code == 200
        for change in ({"name": "x"}, {"tags": ["x"]}, {"archived": True}):
            _refused(http.patch(f"{API}/runs/{uid}", json=change), "manage")
        # a job's field and a person's in one PATCH: refused whole, nothing changed
        both = http.patch(f"{API}/runs/{uid}", json={"status": "failed", "name": "x"})
        _refused(both, "manage")
        _refused(http.delete(f"{API}/runs/{uid}"), "manage")
        _refused(http.put(f"{API}/runs/{uid}?reuse_deleted=true", json=run_body(PROJECT)), "manage")
        run = http.get(f"{API}/runs/{uid}").json()
        assert http.get(f"{API}/auth/whoami").json()["scopes"] == ["read", "write"]
    assert (run["name"], run["status"], run["archived_at"]) == ("r", "finished", None)


def test_a_manage_token_changes_runs_and_does_not_ingest(
    locked: ServerProcess, tokens: dict[str, str]
) -> None:
    uid = _new_run(locked, tokens["default"])
    with locked.client(tokens["manage"]) as http:
        _refused(http.post(f"{API}/runs/{uid}/samples", json={"columns": columns(5)}), "write")
        assert http.patch(f"{API}/runs/{uid}", json={"name": "mine"}).status_code == 200
        assert http.patch(f"{API}/runs/{uid}", json={"tags": ["a"]}).status_code == 200
        assert http.patch(f"{API}/runs/{uid}", json={"archived": True}).status_code == 200
        assert http.patch(f"{API}/runs/{uid}", json={"archived": False}).status_code == 200
        run = http.get(f"{API}/runs/{uid}").json()
        assert (run["name"], run["tags"], run["n_samples"]) == ("mine", ["a"], 20)
        assert http.delete(f"{API}/runs/{uid}").status_code == 204
        assert http.get(f"{API}/runs/{uid}").status_code == 404


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "noisescope.cli", *argv], capture_output=True, text=True
    )


def test_token_create_says_the_scopes_and_refuses_an_unknown_one(locked: ServerProcess) -> None:
    url = locked.database_url
    made = _cli("token", "--database-url", url, "create", "--project", PROJECT, "--scope", "read")
    assert made.returncode == 0 and "scopes: read:" in made.stdout, made
    bad = _cli("token", "create", "--project", PROJECT, "--scope", "delete", "--database-url", url)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "unknown scope 'delete'" in bad.stderr and "read, write, manage" in bad.stderr
    listed = _cli("token", "list", "--project", PROJECT, "--database-url", url)
    assert "read,manage" in listed.stdout and "read,write" in listed.stdout, listed.stdout


@pytest.mark.parametrize("backend", BACKENDS)
def test_tokens_stored_before_scopes_keep_reading_and_ingesting(
    backend: str, tmp_path: Path
) -> None:
    """A populated revision-0004 database, served by this noisescope: the migration gives its
    token ``read write`` and says so; the token reads and ingests as before, and a delete is
    refused with the way to get a ``manage`` token; the stored rows are untouched."""
    with fresh_database(backend, tmp_path) as url:
        engine = db.make_engine(url)
        db.upgrade(engine, "0004")
        populate(engine, project=PROJECT)
        before = dump(engine, ["sample", "sample_block", "event"])
        (old_run,) = dump(engine, ["run"])["run"]
        engine.dispose()
        upgraded = _cli("db", "upgrade", "--database-url", url)
        assert "every existing token got read and write" in upgraded.stdout, upgraded
        with (
            ServerProcess(database_url=url, auth="all") as server,
            server.client(OLD_SECRET) as http,
        ):
            assert http.get(f"{API}/runs/keep-me").json()["name"] == "kept"
            _refused(http.delete(f"{API}/runs/keep-me"), "manage")
            _refused(http.patch(f"{API}/runs/keep-me", json={"name": "x"}), "manage")
            uid = uuid.uuid4().hex
            assert http.put(f"{API}/runs/{uid}", json=run_body(PROJECT)).status_code == 201
            r = http.post(f"{API}/runs/{uid}/samples", json={"columns": columns(7)})
            assert r.json()["inserted"] == 7
        engine = db.make_engine(url)
        tables = ["sample", "sample_block", "series", "event"]
        assert dump(engine, tables) != before  # the new run's
        kept = dump(engine, tables)
        engine.dispose()
    # from 0007 on a series is its number in the run's series table and no estimate is stored:
    # the old run's rows hold the same names and the same values in every column kept
    names = {(r["run_id"], r["id"]): r["name"] for r in kept["series"]}
    for table, rows in before.items():
        mine = [dict(row) for row in kept[table] if row["run_id"] == old_run["id"]]
        for row in mine:
            if "series_id" in row:
                row["series"] = names[(row["run_id"], row.pop("series_id"))]
        dropped = {"g_sq_est", "trace_sigma_est"}
        assert [{k: v for k, v in row.items() if k not in dropped} for row in rows] == mine, table


def _doc_json(page: str, marker: str) -> dict[str, str]:
    """The JSON block of ``docs/<page>`` that contains ``marker``."""
    import json
    import re

    text = (Path(__file__).resolve().parents[2] / "docs" / page).read_text()
    blocks = re.findall(r"```json\n(.*?)```", text, flags=re.S)
    (block,) = [b for b in blocks if marker in b]
    parsed: dict[str, str] = json.loads(block)
    return parsed


def test_the_403_in_the_docs_is_the_servers(locked: ServerProcess) -> None:
    """docs/api.md's 403 example is what a server answers, word for word."""
    url = locked.database_url
    made = _cli("token", "--database-url", url, "create", "--project", "vision", "--name", "ci")
    secret = made.stdout.splitlines()[1]
    with locked.client(secret) as http:
        uid = uuid.uuid4().hex
        assert http.put(f"{API}/runs/{uid}", json=run_body("vision")).status_code == 201
        answer = http.patch(f"{API}/runs/{uid}", json={"name": "x"})
    assert answer.status_code == 403
    assert answer.json() == _doc_json("api.md", "lacks the 'manage' scope")
