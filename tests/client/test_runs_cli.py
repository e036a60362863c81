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
    # issue 56 item 5: an id that names no run is said as such (was the server's 404 for a PATCH)
    assert f"noisescope runs archive {unknown}: no run on " in out.err
    assert "noisescope runs list shows the ids" in out.err
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
    assert "no run on " in capsys.readouterr().err  # gone (was the server's "does not exist")


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


# --- issue 56 item 5: the ids the pages show, and a list to find them -----------------------


def test_a_unique_start_of_an_id_names_the_run(
    server: AppServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every subcommand takes the 8 characters a page shows (or any unique start of an id)."""
    uid = _run(server)
    api = server.api()
    assert main(["runs", "archive", uid[:8]]) == 0
    assert capsys.readouterr().out == f"{uid}: archived\n"  # the full id, said back
    assert api.run(uid).archived_at is not None
    assert main(["runs", "restore", uid[:8]]) == 0  # archived runs are found too
    assert main(["runs", "rename", uid[:10], "short"]) == 0
    assert main(["runs", "tag", uid[:8], "t"]) == 0
    run = api.run(uid)
    assert (run.archived_at, run.name, run.tags) == (None, "short", ["t"])
    capsys.readouterr()
    assert main(["runs", "delete", uid[:8], "--yes"]) == 0
    assert capsys.readouterr().out == f"{uid}: deleted\n"


def test_a_full_id_is_found_without_listing_the_runs(
    server: AppServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full id is read directly: the run list is capped (10,000 runs), so an id found only
    through it would be missed on a bigger server; a start of an id still lists them."""
    uid = _run(server)
    listed: list[int] = []
    api = server.api()
    real_runs = api.runs

    def runs(**kwargs: object) -> object:
        listed.append(1)
        return real_runs(**kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(api, "runs", runs)
    monkeypatch.setattr(_runs_cli, "make_api", lambda url, token: api)
    assert main(["runs", "rename", uid, "direct"]) == 0
    assert listed == []
    assert main(["runs", "tag", uid[:8], "t"]) == 0
    assert listed == [1]
    assert server.api().run(uid).tags == ["t"]
    capsys.readouterr()


def test_a_start_that_several_ids_share_names_none(
    server: AppServer, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = "abc" + uuid.uuid4().hex, "abc" + uuid.uuid4().hex
    with server.client() as http:
        for uid in (a, b):
            put = http.put(f"{protocol.API_PREFIX}/runs/{uid}", json=run_body())
            assert put.status_code == 201
    assert main(["runs", "archive", "abc"]) == 1
    err = capsys.readouterr().err
    assert "noisescope runs archive abc: 2 runs' ids start with it" in err
    assert a in err and b in err and "give more of the id" in err
    assert server.api().run(a).archived_at is None  # nothing changed
    assert protocol.run_ids_matching("abc", [a, b]) == [a, b]
    assert protocol.run_ids_matching(a, [a, a + "0"]) == [a]  # an exact id wins over a start
    assert protocol.run_ids_matching("", [a]) == []


def test_runs_list_filters_and_prints_full_ids(
    server: AppServer, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    uid = uuid.uuid4().hex
    with server.client() as http:
        body = run_body("listed", "t1", tags=["keep"])
        assert http.put(f"{protocol.API_PREFIX}/runs/{uid}", json=body).status_code == 201
    assert main(["runs", "list", "--project", "listed"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["ID", "PROJECT/TASK", "NAME"]
    assert len(lines) == 2 and lines[1].startswith(f"{uid}  listed/t1")
    assert main(["runs", "list", "--project", "listed", "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert (listed["uid"], listed["project"], listed["tags"]) == (uid, "listed", ["keep"])
    assert main(["runs", "list", "--project", "listed", "--tag", "other"]) == 0
    out = capsys.readouterr()
    assert out.out == "" and "no runs match" in out.err
    assert main(["runs", "archive", uid[:8]]) == 0
    capsys.readouterr()
    assert main(["runs", "list", "--project", "listed", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []  # archived: left out unless asked
    assert main(["runs", "list", "--project", "listed", "--archived", "only"]) == 0
    assert "(archived)" in capsys.readouterr().out
    assert main(["runs", "list", "--limit", "0"]) == 2
