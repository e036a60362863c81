"""Harden round 4, the server's part (issue 55 items 1 to 4), against real server processes:
a read token tries every change (item 1), and a token made before scopes existed is upgraded
(item 1); a run is deleted while its job sends (item 2); a run renamed on the server while
its job's remainder waits in the spool, then ``noisescope sync`` (item 3); a database from a
newer noisescope given to ``server``, ``up``, ``db upgrade`` and ``db current`` (item 4).
Each case is a ``reliability._round3.Row``: what was logged, stored, spooled, dropped, what
was said, and whether the class holds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx

import noisescope
from harness.old_rows import (
    FUTURE_REVISION,
    OLD_SECRET,
    database_state,
    future_database,
    populate,
)
from noisescope import protocol
from noisescope_server import db
from reliability._client import B_BIG
from reliability._infra import REPO, Server, Workdir, database, engine_for, port, sync_spool
from reliability._reconcile import check_run, stored_count
from reliability._round3 import (
    ADMIN,
    SEED,
    Row,
    Said,
    _good,
    _log_sample,
    run_status,
    write_auth_server,
)

API = protocol.API_PREFIX
#: Item 2, the issue's case: a job of this many samples over this many seconds, its run
#: deleted this many seconds in.
JOB_SAMPLES, JOB_SECONDS, DELETE_AT_S = 3455, 4.0, 1.5
#: Item 3: samples acknowledged before the rename, and in all.
RENAME_AFTER, RENAME_SAMPLES = 1000, 2000


def make_token(server: Server, project: str, scopes: list[str]) -> tuple[str, int]:
    """A new token of ``project`` with ``scopes`` (made by the admin token): secret and id."""
    made = httpx.post(
        f"{server.url}{API}/projects/{project}/tokens",
        json={"name": "round4", "scopes": scopes},
        headers={"Authorization": f"Bearer {ADMIN}"},
        timeout=30,
    )
    made.raise_for_status()
    return str(made.json()["token"]), int(made.json()["id"])


# -- item 1: scopes ---------------------------------------------------------------------------


def read_token_tries_everything(server: Server) -> Row:
    """A ``read`` token (the dashboard's) reads a job's run and tries every change: each is
    a 403 naming the scope and the command, and the run reads as before."""
    job, _ = make_token(server, "scopes", ["read", "write"])
    reader, _ = make_token(server, "scopes", ["read"])
    uid = uuid.uuid4().hex
    run = noisescope.init(
        url=server.url, token=job, project="scopes", task="t", name="job", run_id=uid,
        batch_size=B_BIG, quiet=True,
    )  # fmt: skip
    for step in range(500):
        _log_sample(run, _good(step))
    run.finish(timeout=60)
    body = {"project": "scopes", "task": "t"}
    tries = [
        ("PUT", f"/runs/{uid}", body),
        ("POST", f"/runs/{uid}/samples", {"columns": {"seq": [9999]}}),
        ("POST", f"/runs/{uid}/events", {"events": [{"step": 1, "kind": "m"}]}),
        ("POST", f"/runs/{uid}/heartbeat", None),
        ("PATCH", f"/runs/{uid}", {"status": "failed"}),
        ("PATCH", f"/runs/{uid}", {"name": "x"}),
        ("PATCH", f"/runs/{uid}", {"tags": ["x"]}),
        ("PATCH", f"/runs/{uid}", {"archived": True}),
        ("DELETE", f"/runs/{uid}", None),
    ]
    refused, named = 0, 0
    headers = {"Authorization": f"Bearer {reader}"}
    with httpx.Client(base_url=server.url + API, headers=headers, timeout=30) as http:
        read_ok = http.get(f"/runs/{uid}").status_code == 200
        for method, path, json in tries:
            answer = http.request(method, path, json=json)
            refused += answer.status_code == 403
            detail = answer.json().get("detail", "") if answer.status_code == 403 else ""
            named += "scope" in detail and "noisescope token create --project scopes" in detail
    after = server.api(job).run(uid)
    stored = stored_count(server.database_url, uid)
    held = (
        read_ok
        and refused == named == len(tries)
        and stored == 500
        and (after.name, after.tags, after.status, after.archived_at)
        == ("job", [], "finished", None)
    )
    return Row(1, "a read token tries every change to a job's run", "500 samples", stored,
               None, None, after.status, held,
               f"reads 200; {refused} of {len(tries)} changes refused 403, {named} naming the "
               "scope and `noisescope token create --project scopes --scope ...`")  # fmt: skip


def token_from_before_scopes(backend: str, workdir: Path) -> Row:
    """A revision-0004 database with a token (the dashboard's, say), served by this
    noisescope: the token reads and ingests as before; deleting is refused, said how."""
    with database(backend, workdir / "old") as url:
        engine = db.make_engine(url)
        db.upgrade(engine, "0004")
        populate(engine, project="old")
        engine.dispose()
        with Server(url, auth="all") as server:
            headers = {"Authorization": f"Bearer {OLD_SECRET}"}
            with httpx.Client(base_url=server.url + API, headers=headers, timeout=30) as http:
                read = http.get("/runs/keep-me").status_code
                deleted = http.delete("/runs/keep-me")
                uid = uuid.uuid4().hex
                made = http.put(f"/runs/{uid}", json={"project": "old", "task": "t"})
            log = server.log()
            stored = stored_count(server.database_url, "keep-me")
    detail = deleted.json().get("detail", "")
    said = "every existing token got read and write" in log
    held = (
        read == 200
        and made.status_code == 201
        and deleted.status_code == 403
        and "--scope manage" in detail
        and stored == 3
        and said
    )
    return Row(1, "a token made at revision 0004, after the upgrade", "3 samples stored before",
               stored, None, None, "—", held,
               f"read {read}, PUT a new run {made.status_code}, DELETE {deleted.status_code} "
               f"naming `--scope manage`; start-up said the tokens' scopes: "
               f"{'yes' if said else 'NO'}")  # fmt: skip


# -- item 2: a deleted run stays deleted ------------------------------------------------------


def delete_during_job(server: Server, workdir: Path) -> list[Row]:
    """The issue's case: DELETE 1.5 s into a 4 s job. Nothing of the run comes back, while
    the job runs on or after ``noisescope sync`` of its spool; the job's client says so."""
    job, _ = make_token(server, "deleted", ["read", "write"])
    manager, _ = make_token(server, "deleted", ["read", "manage"])
    spool = workdir / "deleted"
    uid = uuid.uuid4().hex
    with Said() as said:
        run = noisescope.init(
            url=server.url, token=job, project="deleted", task="t", name="deleted",
            run_id=uid, batch_size=B_BIG, dir=spool, quiet=True,
        )  # fmt: skip
        timer = threading.Timer(DELETE_AT_S, lambda: server.api(manager).delete_run(uid))
        start = time.monotonic()
        timer.start()
        for step in range(JOB_SAMPLES):
            _log_sample(run, _good(step))
            time.sleep(max(0.0, start + JOB_SECONDS * (step + 1) / JOB_SAMPLES - time.monotonic()))
        timer.join()
        status = run.finish(timeout=60)
    stored_at_finish = stored_count(server.database_url, uid)
    code, output = sync_spool(spool, server.url, token=job)
    stored_after_sync = stored_count(server.database_url, uid)
    with httpx.Client(base_url=server.url + API, timeout=30) as http:
        headers = {"Authorization": f"Bearer {job}"}
        read = http.get(f"/runs/{uid}", headers=headers).status_code
        late = http.post(f"/runs/{uid}/heartbeat", headers=headers)
    gone_said = sum("410" in m or "was deleted" in m for m in said.messages)
    held = stored_at_finish == stored_after_sync == 0 and read == 404 and late.status_code == 410
    note = (
        f"acknowledged before the delete (deleted with the run): {status.sent:,}; GET after: "
        f"{read}; a late write: {late.status_code}; the client said 410 / 'was deleted' "
        f"{gone_said} time(s)"
    )
    return [
        Row(2, "DELETE 1.5 s into a 4 s job: at finish", f"{JOB_SAMPLES:,} samples",
            stored_at_finish, status.spooled, status.dropped, "deleted", held, note),
        Row(2, "the same, after `noisescope sync` of its spool", f"{JOB_SAMPLES:,} samples",
            stored_after_sync, None, None, "deleted", held and code in (0, 1),
            f"sync: exit {code}, {(output.splitlines() or [''])[-1][:80]}"),
    ]  # fmt: skip


# -- item 3: a change made on the server wins -------------------------------------------------


def rename_then_sync(server: Server, workdir: Path) -> Row:
    """A run renamed and re-tagged (PATCH, a ``manage`` token) after its job started; the
    job's remainder, spooled (its token revoked), is delivered by ``noisescope sync`` with
    the job's run body: the name and tags stay, every sample is stored."""
    job, job_id = make_token(server, "renamed", ["read", "write"])
    manager, _ = make_token(server, "renamed", ["read", "manage"])
    spool = workdir / "renamed"
    run = noisescope.init(
        url=server.url, token=job, project="renamed", task="t", name="job-name",
        tags=["from-job"], batch_size=B_BIG, dir=spool, quiet=True,
    )  # fmt: skip
    for step in range(RENAME_AFTER):
        _log_sample(run, _good(step))
    run.flush(60)
    people = server.api(manager)
    people.rename_run(run.id, "renamed-on-server")
    people.set_tags(run.id, ["kept"])
    httpx.delete(
        f"{server.url}{API}/tokens/{job_id}",
        headers={"Authorization": f"Bearer {ADMIN}"},
        timeout=30,
    ).raise_for_status()
    for step in range(RENAME_AFTER, RENAME_SAMPLES):
        _log_sample(run, _good(step))
    status = run.finish(timeout=60)
    fresh, _ = make_token(server, "renamed", ["read", "write"])
    code, output = sync_spool(spool, server.url, token=fresh)
    after = people.run(run.id)
    engine = engine_for(server.database_url)
    try:
        check = check_run(engine, run.id, SEED, RENAME_SAMPLES)
    finally:
        engine.dispose()
    held = (
        code == 0
        and (after.name, after.tags) == ("renamed-on-server", ["kept"])
        and check.stored == check.distinct == RENAME_SAMPLES
        and check.values_ok
    )
    return Row(3, "renamed and re-tagged on the server, then `noisescope sync` of the job's "
               "spool", f"{RENAME_SAMPLES:,} samples", check.stored, status.spooled,
               status.dropped, run_status(server, run.id), held,
               f"name {after.name!r}, tags {after.tags} after sync (the job sent 'job-name', "
               f"['from-job']); sync: {(output.splitlines() or [''])[-1][:80]}")  # fmt: skip


# -- item 4: a database newer than the code ---------------------------------------------------


def newer_database(backend: str, workdir: Path) -> list[Row]:
    """Each command given a database at a revision this noisescope does not know."""
    rows = []
    with database(backend, workdir / "newer") as url:
        future_database(url)
        before = database_state(url)
        env = {**os.environ, "NOISESCOPE_HOME": str(workdir)}
        env.pop("NOISESCOPE_DATABASE_URL", None)
        commands = {
            "server": ["server", "--port", str(port())],
            "up": ["up", "--no-dashboard", "--port", str(port())],
            "db upgrade": ["db", "upgrade"],
            "db current": ["db", "current"],
        }
        for name, argv in commands.items():
            out = subprocess.run(
                [sys.executable, "-m", "noisescope.cli", *argv, "--database-url", url],
                capture_output=True, text=True, env=env, timeout=120, cwd=REPO,
            )  # fmt: skip
            said = (out.stderr if name != "db current" else out.stdout).strip().splitlines()
            unchanged = database_state(url) == before
            want = 0 if name == "db current" else 2
            last = said[-1] if said else ""
            names_both = FUTURE_REVISION in last and db.head_revision() in last
            held = (
                out.returncode == want
                and len(said) == 1
                and names_both
                and "newer than this noisescope" in said[0]
                and "Traceback" not in out.stderr
                and unchanged
            )
            line = said[0].replace(url, "URL")[:160] if said else "(nothing)"
            rows.append(Row(4, f"`noisescope {name}` on a revision-{FUTURE_REVISION} database",
                            "—", None, None, None, f"exit {out.returncode}", held,
                            f"{len(said)} line(s); database unchanged: "
                            f"{'yes' if unchanged else 'NO'}; said: {line}"))  # fmt: skip
    return rows


def round4_server(backend: str) -> tuple[bool, list[Row]]:
    """Every case on ``backend``: whether all held, and the rows."""
    wd = Workdir.make(f"round4-server-{backend}")
    try:
        rows: list[Row] = []
        with write_auth_server(backend, wd.path) as srv:
            rows.append(read_token_tries_everything(srv))
            rows += delete_during_job(srv, wd.path)
            rows.append(rename_then_sync(srv, wd.path))
        rows.append(token_from_before_scopes(backend, wd.path))
        rows += newer_database(backend, wd.path)
    finally:
        wd.close()
    return all(r.held for r in rows), rows


def section_body(backend: str, rows: list[Row], table: str) -> str:
    """The report's words above the table."""
    return (
        "Issue 55, the server's items, against `noisescope server --auth write` on "
        f"{backend} (tokens made with the admin token, with the scopes each case names), the "
        "real client in the harness's process. Item 1: a `read` token reads a finished run "
        "of 500 samples and tries every change (PUT, samples, events, heartbeat, PATCH of "
        "status, name, tags, archived, DELETE); and a revision-0004 database with a token "
        "served by this noisescope (`--auth all`). Item 2: the issue's case, a job of "
        f"{JOB_SAMPLES:,} samples over {JOB_SECONDS:g} s whose run is deleted "
        f"{DELETE_AT_S:g} s in (a `manage` token), then `noisescope sync` of its spool; "
        "stored: the run's rows in the database; spooled and dropped: the client's "
        "`status()` at finish. Item 3: a run renamed and re-tagged after "
        f"{RENAME_AFTER:,} of {RENAME_SAMPLES:,} samples were acknowledged; the job's token "
        "is then revoked, so the rest and the run body go to the spool, which `noisescope "
        "sync --token NEW` delivers. Item 4: each command given a database whose "
        f"`alembic_version` reads {FUTURE_REVISION} (a newer noisescope's); unchanged: the SQLite "
        "file's bytes, or every PostgreSQL row (`reliability._round4_server`).\n\n" + table
    )
