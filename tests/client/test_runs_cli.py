"""``noisescope runs archive|restore|delete|rename|tag`` against the app in this process
(``AppServer``, reached through ``_runs_cli.make_api``): what each prints and exits with, and
that delete asks on a terminal and refuses without ``--yes`` when nobody can answer."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator

import pytest

from harness import AppServer, columns, run_body
from noisescope import _runs_cli, protocol
from noisescope.cli import main


@pytest.fixture(scope="module")
def server() -> Iterator[AppServer]:
    with AppServer() as app:
        yield app


@pytest.fixture(autouse=True)
def _on_server(server: AppServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_runs_cli, "make_api", lambda url, token: server.api(token))


def _run(server: AppServer) -> str:
    uid = uuid.uuid4().hex
    with server.client() as http:
        assert http.put(f"{protocol.API_PREFIX}/runs/{uid}", json=run_body()).status_code == 201
        body = {"columns": columns(70)}
        assert http.post(f"{protocol.API_PREFIX}/runs/{uid}/samples", json=body).status_code == 200
    return uid


def test_archive_restore_rename_tag(server: AppServer, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = _run(server), _run(server)
    api = server.api()
    assert main(["runs", "archive", a, b, "--url", "http://127.0.0.1:8765"]) == 0
    assert capsys.readouterr().out == f"{a}: archived\n{b}: archived\n"
    assert api.run(a).archived_at is not None and api.run(b).archived_at is not None
    assert main(["runs", "restore", a]) == 0
    assert api.run(a).archived_at is None
    assert main(["runs", "rename", a, "better name"]) == 0
    assert main(["runs", "tag", a, "x", "y"]) == 0
    run = api.run(a)
    assert (run.name, run.tags) == ("better name", ["x", "y"])
    assert main(["runs", "tag", a, "--clear"]) == 0
    assert api.run(a).tags == []
    out = capsys.readouterr()
    assert "renamed 'better name'" in out.out and "tagged x, y" in out.out and not out.err


def test_failures_are_said_and_exit_1(
    server: AppServer, capsys: pytest.CaptureFixture[str]
) -> None:
    known, unknown = _run(server), uuid.uuid4().hex
    assert main(["runs", "archive", unknown, known]) == 1
    out = capsys.readouterr()
    assert out.out == f"{known}: archived\n"
    assert f"noisescope runs archive {unknown}: PATCH " in out.err and "404" in out.err
    assert main(["runs", "rename", known, "x" * (protocol.MAX_NAME_LENGTH + 1)]) == 1
    assert "422" in capsys.readouterr().err
    assert main(["runs", "tag", known]) == 2  # no tags and no --clear: nothing done
    assert "--clear" in capsys.readouterr().err


def test_delete_refuses_without_a_terminal_or_yes(
    server: AppServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    uid = _run(server)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False, raising=False)
    assert main(["runs", "delete", uid]) == 2
    assert "--yes" in capsys.readouterr().err
    assert server.api().run(uid).n_samples == 70
    assert main(["runs", "delete", uid, "--yes"]) == 0
    assert capsys.readouterr().out == f"{uid}: deleted\n"
    assert main(["runs", "delete", uid, "--yes"]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_delete_asks_on_a_terminal(
    server: AppServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    uid = _run(server)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
    answers = iter(["n", "y"])
    monkeypatch.setattr("builtins.input", lambda prompt: next(answers))
    assert main(["runs", "delete", uid]) == 2
    out = capsys.readouterr()
    assert f"{uid} 'r' in proj/task: 70 samples" in out.out and "nothing deleted" in out.err
    assert server.api().run(uid).n_samples == 70
    assert main(["runs", "delete", uid]) == 0
    assert f"{uid}: deleted" in capsys.readouterr().out
