"""The server subcommands of ``noisescope``: db, token, server/up/dashboard start-up, bad
database URLs, run links, TCP_NODELAY."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness import ServerProcess, free_port, wait_for_health
from noisescope.cli import SERVER_COMMANDS, build_parser, main
from noisescope_server import cli as server_cli
from noisescope_server import db
from noisescope_server.cli import bind_socket, dashboard_command, dashboard_env


def test_db_upgrade_and_current(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "--database-url", db_url, "current"]) == 0
    assert "needs `noisescope db upgrade`" in capsys.readouterr().out
    assert main(["db", "--database-url", db_url, "upgrade"]) == 0
    assert f"empty -> {db.head_revision()}" in capsys.readouterr().out
    assert main(["db", "--database-url", db_url, "current"]) == 0
    assert "up to date" in capsys.readouterr().out


def test_token_create_list_revoke(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["token", "--database-url", db_url, "create", "--project", "lab", "--name", "ci"]) == 0
    )
    out = capsys.readouterr().out
    secret = out.splitlines()[1]
    assert secret.startswith("nsk_")
    assert "shown only once" in out
    assert main(["token", "--database-url", db_url, "list"]) == 0
    listing = capsys.readouterr().out
    assert "lab" in listing
    assert "active" in listing
    assert secret not in listing
    assert main(["token", "--database-url", db_url, "revoke", "1", "--project", "other"]) == 1
    assert main(["token", "--database-url", db_url, "revoke", "1"]) == 0
    assert main(["token", "--database-url", db_url, "list", "--project", "lab"]) == 0
    assert "revoked" in capsys.readouterr().out


def test_listening_socket_sets_tcp_nodelay_for_accepted_connections() -> None:
    """uvicorn issue 3149: with --workers N uvicorn's own socket lacks TCP_NODELAY and
    keep-alive clients stall ~40 ms per request. Our socket sets it; Linux accepted sockets
    inherit it from the listener."""
    listener = bind_socket("127.0.0.1", 0)
    try:
        assert listener.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        client = socket.create_connection(listener.getsockname())
        accepted, _ = listener.accept()
        assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        accepted.close()
        client.close()
    finally:
        listener.close()


def test_multi_worker_server_against_postgresql(pg_url: str) -> None:
    """Two workers migrate the same empty database at start-up without racing, then serve."""
    with (
        ServerProcess(database_url=pg_url, workers=2) as server,
        httpx.Client(base_url=server.url) as c,
    ):
        for i in range(10):
            r = c.put(f"/api/v1/runs/w{i}", json={"project": "p", "task": "t"})
            assert r.status_code == 201, r.text
        assert len(c.get("/api/v1/runs").json()) == 10


def test_server_survives_kill_and_restart(live_server: ServerProcess) -> None:
    httpx.put(f"{live_server.url}/api/v1/runs/k1", json={"project": "p", "task": "t"})
    live_server.kill()
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{live_server.url}/api/v1/health", timeout=2)
    live_server.restart()
    assert httpx.get(f"{live_server.url}/api/v1/runs/k1").status_code == 200


def test_up_without_dashboard_prints_paths_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "NOISESCOPE_HOME": str(tmp_path)}
    env.pop("NOISESCOPE_DATABASE_URL", None)
    env.pop("NOISESCOPE_DASHBOARD_URL", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "noisescope.cli", "up", "--no-dashboard", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # up prints its last line once both are ready
            lines.append(line)
            if "Ctrl-C stops both" in line:
                break
        wait_for_health(f"http://127.0.0.1:{port}", 10)
        put = httpx.put(
            f"http://127.0.0.1:{port}/api/v1/runs/{uuid.uuid4().hex}",
            json={"project": "p", "task": "t"},
            timeout=30,
        )
        assert put.json()["dashboard_url"] is None  # no dashboard started: no links to it
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=30)
        out = "".join(lines) + rest
    finally:
        if proc.poll() is None:
            proc.kill()
    assert str(tmp_path / "noisescope.db") in out
    assert "migrations applied" in out
    assert f"http://127.0.0.1:{port}" in out
    assert "auth is off" in out
    assert proc.returncode == 0
    assert "Traceback" not in out
    with pytest.raises(httpx.TransportError):  # the server went down with it
        httpx.get(f"http://127.0.0.1:{port}/api/v1/health", timeout=2)


def test_dashboard_command_runs_the_shipped_streamlit_app() -> None:
    cmd = dashboard_command(8599)
    app = Path(cmd[cmd.index("run") + 1])
    assert app.name == "app.py"
    assert app.exists()
    assert "--server.headless" in cmd
    assert cmd[cmd.index("--server.port") + 1] == "8599"
    assert cmd[cmd.index("--browser.gatherUsageStats") + 1] == "false"
    # no Deploy button or developer menu for people looking at their runs
    assert cmd[cmd.index("--client.toolbarMode") + 1] == "minimal"


def test_streamlit_knows_the_toolbar_mode_option() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "streamlit", "config", "show"],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert '- "minimal"' in shown
    assert "toolbarMode" in shown


def test_dashboard_env_names_the_server_and_no_database() -> None:
    base = {"PATH": "/bin", "NOISESCOPE_DATABASE_URL": "sqlite:///x.db", "NOISESCOPE_TOKEN": "old"}
    env = dashboard_env("http://127.0.0.1:9", "nsk_read", base)
    assert env == {
        "PATH": "/bin",
        "NOISESCOPE_URL": "http://127.0.0.1:9",
        "NOISESCOPE_TOKEN": "nsk_read",
    }
    assert "NOISESCOPE_TOKEN" not in dashboard_env("http://127.0.0.1:9", None, base)


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found: argparse.ArgumentParser = sub.choices[name]
    return found


def test_dashboard_help_says_what_it_is_and_describes_every_option(
    capsys: pytest.CaptureFixture[str],
) -> None:
    dash = _subparser("dashboard")
    options = {o for a in dash._actions for o in a.option_strings}
    assert options == {"-h", "--help", "--url", "--token", "--port", "--host"}
    assert all(a.help for a in dash._actions)
    with pytest.raises(SystemExit) as exited:
        main(["dashboard", "--help"])
    assert exited.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "HTTP API" in out and "never the database" in out
    assert "$NOISESCOPE_URL, else http://127.0.0.1:8765" in out
    assert "$NOISESCOPE_TOKEN" in out
    assert "dashboard port (8501)" in out
    assert "bind address (127.0.0.1)" in out


def _child_environ(
    parent: subprocess.Popen[bytes], program: bytes, timeout: float = 60
) -> dict[str, str]:
    """The environment of ``parent``'s first child once it runs ``program`` (Linux /proc).

    Between fork and exec the child still carries the parent's environment, so its
    environment counts only once its command line names ``program``.
    """
    deadline = time.monotonic() + timeout
    children = Path(f"/proc/{parent.pid}/task/{parent.pid}/children")
    while time.monotonic() < deadline:
        pids = children.read_text().split() if children.exists() else []
        if pids and program in _read_or_empty(Path(f"/proc/{pids[0]}/cmdline")).split(b"\0"):
            raw = _read_or_empty(Path(f"/proc/{pids[0]}/environ"))
            if raw:
                pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
                return {k.decode(): v.decode() for k, _, v in pairs}
        assert parent.poll() is None, "noisescope dashboard exited"
        time.sleep(0.05)
    raise AssertionError(f"noisescope dashboard started no {program.decode()} process")


def _read_or_empty(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # the process is gone
        return b""


def test_dashboard_starts_streamlit_reading_the_given_server(tmp_path: Path) -> None:
    env = {**os.environ, "NOISESCOPE_DATABASE_URL": f"sqlite:///{tmp_path / 'x.db'}"}
    env["NOISESCOPE_TOKEN"] = "nsk_from_env"
    port = free_port()
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "noisescope.cli", "dashboard"),
            *("--url", "http://127.0.0.1:9/", "--port", str(port)),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        child = _child_environ(proc, b"streamlit")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    assert child["NOISESCOPE_URL"] == "http://127.0.0.1:9"
    assert child["NOISESCOPE_TOKEN"] == "nsk_from_env"  # --token's default
    assert "NOISESCOPE_DATABASE_URL" not in child


def _children(parent: int) -> list[int]:
    path = Path(f"/proc/{parent}/task/{parent}/children")
    return [int(pid) for pid in _read_or_empty(path).split()]


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, exited but not reaped, is not)."""
    stat = _read_or_empty(Path(f"/proc/{pid}/stat"))
    return bool(stat) and stat.rsplit(b")", 1)[1].split()[0] != b"Z"


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_signal_to_noisescope_dashboard_stops_streamlit(sig: signal.Signals) -> None:
    """``kill PID`` (or SIGINT to that process alone) stops the Streamlit child and frees its
    port, then exits 0."""
    port = free_port()
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "noisescope.cli", "dashboard"),
            *("--url", "http://127.0.0.1:9", "--port", str(port)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not _answers(f"http://127.0.0.1:{port}/_stcore/health"):
            assert proc.poll() is None and time.monotonic() < deadline, "Streamlit did not start"
            time.sleep(0.2)
        (streamlit,) = _children(proc.pid)
        proc.send_signal(sig)  # the parent only, as `kill PID` does
        assert proc.wait(30) == 0
        deadline = time.monotonic() + 5
        while _running(streamlit) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(streamlit), "Streamlit left running"
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{port}/_stcore/health", timeout=2)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def test_the_server_commands_have_the_help_lines_shown_without_the_server_install() -> None:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    shown = {c.dest: c.help for c in sub._choices_actions}
    assert {name: shown[name] for name in SERVER_COMMANDS} == SERVER_COMMANDS
    assert set(shown) - set(SERVER_COMMANDS) == {"sync", "runs"}  # the client's own


def test_the_server_commands_come_from_the_entry_point_group(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``noisescope.cli`` imports no server code: it finds the server's ``register`` through
    the entry point group the server distribution declares (pyproject.toml). Without such an
    entry, or with one whose module cannot be imported, the names stay and say how to install
    the server."""
    from importlib import metadata

    from noisescope import cli as client_cli

    (entry,) = metadata.entry_points(group=client_cli.COMMANDS_GROUP)
    assert entry.value == "noisescope_server.cli:register"
    assert entry.load() is server_cli.register
    gone = metadata.EntryPoint("server", "noisescope_no_such_server:register", entry.group)
    for entries, says in (([], client_cli.SERVER_INSTALL_HINT), ([gone], gone.value)):

        def installed(group: str, found: list[metadata.EntryPoint] = entries) -> Any:
            assert group == client_cli.COMMANDS_GROUP
            return found

        monkeypatch.setattr(metadata, "entry_points", installed)
        assert main(["up"]) == 2
        assert says in capsys.readouterr().err


def test_a_broken_server_install_says_why_and_leaves_the_other_commands_working(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An entry whose module fails to import (a dependency missing), lacks ``register``, or
    whose ``register`` raises: the client's own commands still parse and run, and each server
    command says what failed instead of telling the user to install what is installed."""
    from importlib import metadata

    from noisescope import cli as client_cli

    group = client_cli.COMMANDS_GROUP
    broken = [
        metadata.EntryPoint("server", "noisescope_no_such_server:register", group),
        metadata.EntryPoint("server", "noisescope._format:no_such_register", group),
        metadata.EntryPoint("server", "noisescope._format:plural", group),  # wrong signature
    ]
    for entry in broken:
        monkeypatch.setattr(metadata, "entry_points", lambda group, e=entry: [e])
        parser = build_parser()  # never raises
        assert parser.parse_args(["runs", "archive", "x"]).command == "runs"
        assert main(["up"]) == 2
        err = capsys.readouterr().err
        assert "installed but" in err and entry.value in err, err
        assert client_cli.SERVER_INSTALL_HINT not in err
    other = metadata.EntryPoint("other", "noisescope._format:plural", group)
    monkeypatch.setattr(metadata, "entry_points", lambda group: [other])
    assert set(SERVER_COMMANDS) <= set(  # another distribution's entry hides no placeholder
        next(
            a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
        ).choices
    )


def test_the_dashboard_app_is_found_without_importing_the_dashboard() -> None:
    """``noisescope dashboard`` runs the dashboard's ``app.py`` in Streamlit's process; the
    server finds the file from the import system's spec, which runs none of the package."""
    code = (
        "import sys\n"
        "from noisescope_server.cli import dashboard_app\n"
        "print(dashboard_app())\n"
        "print(any(m.split('.')[0] == 'noisescope_dashboard' for m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    app, loaded = done.stdout.split()
    assert Path(app).name == "app.py" and Path(app).is_file()
    assert Path(app).parent.name == "noisescope_dashboard"
    assert loaded == "False"


def test_dashboard_url_option_is_checked() -> None:
    with pytest.raises(SystemExit) as exited:
        main(["dashboard", "--url", "127.0.0.1:8765"])
    assert exited.value.code == 2


def test_log_level_lists_the_uvicorn_levels(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        server_cli.main(["--help"])
    assert exited.value.code == 0
    assert "{critical,error,warning,info,debug,trace}" in capsys.readouterr().out
    for argv in (["server", "--log-level", "loud"], ["server", "--log-level", "WARNING"]):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2
        assert "invalid choice" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        server_cli.main(["--log-level", "loud"])
    assert "invalid choice: 'loud'" in capsys.readouterr().err


def _bad_urls(tmp_path: Path) -> dict[str, str]:
    return {
        "unknown kind": "nonsense://x",
        "not a URL": "nonsense",
        "missing directory": f"sqlite:///{tmp_path / 'missing' / 'x.db'}",
        "file as directory": f"sqlite:///{tmp_path / 'file' / 'x.db'}",
        "unreachable": f"postgresql+psycopg://ns:s3cret-pw@127.0.0.1:{free_port()}/x",
        "no driver": "postgresql+asyncpg://ns@127.0.0.1/x",
    }


@pytest.mark.parametrize(
    "command",
    [
        ["server"],
        ["db", "upgrade"],
        ["db", "current"],
        ["token", "list"],
        ["token", "create", "--project", "p"],
        ["token", "revoke", "1"],
    ],
    ids=" ".join,
)
def test_a_bad_database_url_is_one_line_and_status_2(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("")
    # a free port, not the default: the suite runs beside a `noisescope up` (issue 56 item 3)
    port = ["--port", str(free_port())] if command == ["server"] else []
    for kind, url in _bad_urls(tmp_path).items():
        with pytest.raises(SystemExit) as exited:
            main([*command, "--database-url", url, *port])
        assert exited.value.code == 2, kind
        captured = capsys.readouterr()
        lines = captured.err.splitlines()
        assert len(lines) == 1, (kind, captured.err)
        assert lines[0].startswith("noisescope: cannot open database "), kind
        assert "s3cret-pw" not in captured.err + captured.out, kind
        assert "Traceback" not in captured.err, kind
    assert not (tmp_path / "missing").exists()  # a typo does not start an empty database


def test_bad_database_urls_name_the_url_and_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("")
    urls = _bad_urls(tmp_path)
    expected = {
        "unknown kind": ["nonsense://x", "unknown database kind 'nonsense'"],
        "not a URL": ["'nonsense'", "not a database URL"],
        "missing directory": [urls["missing directory"], f"{tmp_path / 'missing'} does not exist"],
        "file as directory": [f"{tmp_path / 'file'} is not a directory"],
        "unreachable": ["postgresql+psycopg://ns:***@127.0.0.1", "Connection refused"],
        "no driver": ["driver is not installed", "asyncpg"],
    }
    for kind, url in urls.items():
        with pytest.raises(SystemExit):
            main(["db", "current", "--database-url", url])
        err = capsys.readouterr().err
        for part in expected[kind]:
            assert part in err, (kind, err)


def _refused(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``noisescope argv``, which must exit 2 saying why in one line (no traceback)."""
    out = subprocess.run(
        [sys.executable, "-m", "noisescope.cli", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
    return out


@pytest.mark.parametrize("command", [["server"], ["up", "--no-dashboard"]], ids=" ".join)
def test_a_bad_database_url_exits_2_without_a_traceback(command: list[str], tmp_path: Path) -> None:
    env = {**os.environ, "NOISESCOPE_HOME": str(tmp_path)}
    env.pop("NOISESCOPE_DATABASE_URL", None)
    url = f"postgresql+psycopg://ns:s3cret-pw@127.0.0.1:{free_port()}/x"
    for argv in (
        [*command, "--database-url", url, "--port", str(free_port())],
        [
            *command,
            "--database-url",
            "sqlite:////nonexistent-dir-ns/x.db",
            "--port",
            str(free_port()),
        ],
    ):
        out = _refused(argv, env)
        assert "cannot open database" in out.stderr
        assert "Traceback" not in out.stderr + out.stdout
        assert "s3cret-pw" not in out.stderr + out.stdout
    assert not Path("/nonexistent-dir-ns").exists()


def test_a_bad_database_url_in_the_environment_is_reported_too(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NOISESCOPE_DATABASE_URL", "nonsense://from-env")
    with pytest.raises(SystemExit) as exited:
        main(["db", "upgrade"])
    assert exited.value.code == 2
    assert "nonsense://from-env" in capsys.readouterr().err


class _LinkingServer(ServerProcess):
    """``python -m noisescope_server --dashboard-url URL``."""

    def __init__(self, dashboard_url: str) -> None:
        super().__init__()
        self.dashboard_url = dashboard_url

    def command(self) -> list[str]:
        return [*super().command(), "--dashboard-url", self.dashboard_url]


def test_dashboard_url_option_puts_run_links_in_the_answers() -> None:
    run_id = uuid.uuid4().hex
    with _LinkingServer("http://dash.example:8501/") as server:
        body = {"project": "p", "task": "t"}
        put = httpx.put(f"{server.url}/api/v1/runs/{run_id}", json=body, timeout=30)
        patch = httpx.patch(
            f"{server.url}/api/v1/runs/{run_id}", json={"status": "finished"}, timeout=30
        )
    link = f"http://dash.example:8501/run?run={run_id}"
    assert put.status_code == 201, put.text
    assert put.json()["dashboard_url"] == link
    assert patch.json()["dashboard_url"] == link


def test_no_run_links_without_a_dashboard_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOISESCOPE_DASHBOARD_URL", raising=False)
    run_id = uuid.uuid4().hex
    with ServerProcess() as server:
        put = httpx.put(
            f"{server.url}/api/v1/runs/{run_id}", json={"project": "p", "task": "t"}, timeout=30
        )
    assert put.status_code == 201, put.text
    assert put.json()["dashboard_url"] is None


@pytest.mark.parametrize(
    ("command", "taken", "flag"),
    [
        (["up", "--no-dashboard"], "server", "--port"),
        (["up"], "server", "--port"),
        (["up"], "dashboard", "--dashboard-port"),
        (["server"], "server", "--port"),
    ],
    ids=["up-no-dashboard", "up-server-port", "up-dashboard-port", "server"],
)
def test_a_taken_port_is_one_line_and_status_2_before_any_url(
    command: list[str], taken: str, flag: str, tmp_path: Path
) -> None:
    env = {**os.environ, "NOISESCOPE_HOME": str(tmp_path)}
    env.pop("NOISESCOPE_DATABASE_URL", None)
    with socket.socket() as holder:  # something else listens there
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        busy = holder.getsockname()[1]
        ports = {"server": busy, "dashboard": free_port()} if taken == "server" else {
            "server": free_port(), "dashboard": busy}  # fmt: skip
        argv = [*command, "--port", str(ports["server"])]
        if command == ["up"]:
            argv += ["--dashboard-port", str(ports["dashboard"])]
        out = _refused(argv, env)
    assert f"port {busy} on 127.0.0.1 is already in use" in out.stderr
    assert flag in out.stderr
    assert "http://" not in out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    assert not (tmp_path / "noisescope.db").exists()  # refused before touching anything


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("NOISESCOPE_CRASH_AFTER", "soon"),
        ("NOISESCOPE_READ_TIMEOUT", "-1"),
        ("NOISESCOPE_AUTH", "bogus"),
    ],
)
def test_a_bad_setting_is_one_line_and_status_2(variable: str, value: str, tmp_path: Path) -> None:
    env = {**os.environ, "NOISESCOPE_HOME": str(tmp_path), variable: value}
    out = _refused(["server", "--port", str(free_port())], env)
    assert variable.removeprefix("NOISESCOPE_").lower() in out.stderr.lower()
