"""Issue 46, item 10: a token sent in a URL's query (``?token=``, refused: tokens go in the
``Authorization`` header) never reaches the server's access log; the log says where it was.
``noisescope dashboard`` prints no password of the server URL either.

A real process (``noisescope server --access-log``): the access log is uvicorn's. The secret
never touches storage, so one backend (SQLite) is enough."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import ServerProcess
from noisescope_server.logs import RedactSecrets

SECRET = "s3cr3t-t0ken-in-the-url"


class _AccessLogged(ServerProcess):
    """The server with its access log on (info level)."""

    def command(self) -> list[str]:
        cmd = super().command()
        cmd[cmd.index("--log-level") + 1] = "info"
        return [*cmd, "--access-log"]


@pytest.fixture(scope="module")
def logged() -> Iterator[ServerProcess]:
    with _AccessLogged(auth="all") as proc:
        yield proc


def test_a_token_in_the_query_is_masked_in_the_access_log(logged: ServerProcess) -> None:
    with logged.client() as c:
        paths = [
            f"/api/v1/runs?token={SECRET}",
            f"/api/v1/runs?project=p&access_token={SECRET}&limit=5",
            f"/api/v1/runs?%74oken={SECRET}",  # the server reads the name as "token" too
            f"/api/v1/tasks?TOKEN={SECRET}",
        ]
        for path in paths:
            assert c.get(path).status_code == 401  # refused: no bearer token
    log = logged.log()
    assert SECRET not in log
    assert log.count('GET /api/v1/runs?token=*** HTTP/1.1" 401') == 2
    assert "GET /api/v1/runs?project=p&access_token=***&limit=5 HTTP/1.1" in log
    assert "GET /api/v1/tasks?TOKEN=*** HTTP/1.1" in log


def test_the_filter_keeps_the_access_formatters_arguments() -> None:
    """uvicorn's access formatter unpacks five arguments: they stay five, only masked."""
    args = ("127.0.0.1:5000", "GET", f"/x?token={SECRET}&a=1", "1.1", 200)
    record = logging.LogRecord("uvicorn.access", 20, "", 0, '%s - "%s %s HTTP/%s" %d', args, None)
    assert RedactSecrets().filter(record)
    assert record.args == ("127.0.0.1:5000", "GET", "/x?token=***&a=1", "1.1", 200)
    text = "database at postgresql://user:pw@db/x"
    record = logging.LogRecord("noisescope_server", 30, "", 0, text, None, None)
    RedactSecrets().filter(record)
    assert record.getMessage() == "database at postgresql://user:***@db/x"


def test_noisescope_dashboard_prints_no_password(tmp_path: Path) -> None:
    """``noisescope dashboard`` with a URL the check refuses (no scheme) names it masked."""
    env = {**os.environ, "NOISESCOPE_URL": f"me:{SECRET}@127.0.0.1:9", "HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "noisescope.cli", "dashboard"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert SECRET not in done.stdout + done.stderr
    assert "'me:***@127.0.0.1:9' is not an http(s) URL" in done.stderr
