"""The server subcommands of ``noisescope``: db, token, server/up start-up, TCP_NODELAY."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from noisescope.cli import main
from noisescope_server import db
from noisescope_server.cli import bind_socket, dashboard_command
from tests.support.servers import ServerProcess, free_port, wait_for_health


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
    cmd = dashboard_command("sqlite:///x.db", 8599)
    app = Path(cmd[cmd.index("run") + 1])
    assert app.name == "app.py"
    assert app.exists()
    assert "--server.headless" in cmd
