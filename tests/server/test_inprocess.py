"""The in-process server (harness/inprocess.py) is the server process's app: the same
answers, settings and log, and the client's writer and reader work through its transport.

Most endpoint tests run on it (tests/server/conftest.py); these check that what they see is
what a real ``python -m noisescope_server`` answers."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

import noisescope
from harness import AppServer, ServerProcess, columns, run_body
from noisescope import Transport
from noisescope_server import queries

API = "/api/v1"


def test_it_answers_as_the_process_does(tmp_path: Path) -> None:
    """One database, the app in this process and a real process: the same status and body for
    a write's read-back, the run list, the OpenAPI schema, a refusal and an unknown path."""
    url = f"sqlite:///{tmp_path / 'noisescope.db'}"
    rid = uuid.uuid4().hex
    env = {"NOISESCOPE_MAX_SAMPLES": "10"}
    with AppServer(url, env=env) as app, app.client() as c:
        assert c.put(f"{API}/runs/{rid}", json=run_body(project="same")).status_code == 201
        assert c.post(f"{API}/runs/{rid}/samples", json={"columns": columns(5)}).is_success
        paths = [
            f"{API}/runs/{rid}",
            f"{API}/runs?project=same",
            f"{API}/runs/{rid}/series",
            f"{API}/openapi.json",
            f"{API}/runs/{rid}/samples.csv",
            f"{API}/runs/no..such",
            f"{API}/nope",
        ]
        inside = [c.get(path) for path in paths]
        too_many = c.post(f"{API}/runs/{rid}/samples", json={"columns": columns(11)})
    with ServerProcess(url, env=env) as proc, proc.client() as p:
        outside = [p.get(path) for path in paths]
        too_many_outside = p.post(f"{API}/runs/{rid}/samples", json={"columns": columns(11)})
    for path, a, b in zip(paths, inside, outside, strict=True):
        assert (a.status_code, a.content) == (b.status_code, b.content), path
        assert a.headers["content-type"] == b.headers["content-type"], path
    assert too_many.status_code == too_many_outside.status_code == 413
    assert too_many.json() == too_many_outside.json()


def test_a_server_bug_is_a_500_with_its_traceback_in_the_log(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As uvicorn does: a 500 without the bug's message, and "Exception in ASGI application"
    with the traceback in the log (so "no traceback in the log" checks mean the same)."""

    def boom(*_args: object, **_kwargs: object) -> object:
        raise RuntimeError("internal: bad state")

    with AppServer() as app, app.client() as c:
        assert app.log() == ""
        monkeypatch.setattr(queries, "list_projects", boom)
        r = c.get(f"{API}/projects")
        assert r.status_code == 500
        assert "internal: bad state" not in r.text
        log = app.log()
    assert "Exception in ASGI application" in log and "Traceback" in log
    assert "RuntimeError: internal: bad state" in log


def test_the_writer_and_the_reader_go_through_its_transport(tmp_path: Path) -> None:
    """``noisescope.init(transport=)`` from the sender thread and ``Api`` from this one, with
    a project token under auth "write"; a transport shared by several runs stays usable."""
    with AppServer(auth="write", env={"NOISESCOPE_ADMIN_TOKEN": "adm"}) as app:
        with app.client(token="adm") as admin:
            token = admin.post(f"{API}/projects/tp/tokens").json()["token"]
        transport = app.transport(token)
        assert isinstance(transport, Transport)
        for n in (1, 2):
            run = noisescope.init(
                app.url, project="tp", task="t", quiet=True, dir=tmp_path, transport=transport
            )
            for step in range(70 * n):
                run.log_sample(step, 8, 64, 2.0 + step % 3, 1.5)
            status = run.finish()
            assert (status.sent, status.dropped, status.spooled) == (70 * n, 0, 0)
            assert app.api().run(run.id).n_samples == 70 * n
        refused = noisescope.init(
            app.url, project="tp", task="t", quiet=True, dir=tmp_path / "x",
            transport=app.transport(),  # no token: every write is a 401
        )  # fmt: skip
        refused.log_sample(0, 8, 64, 2.0, 1.5)
        assert refused.finish().sent == 0
