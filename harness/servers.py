"""Real noisescope servers in subprocesses, for HTTP and fault tests.

``ServerProcess`` runs ``python -m noisescope_server`` on a loopback port, waits for
``GET /api/v1/health``, and can be stopped (SIGINT, graceful), killed (SIGKILL, as a crash) and
restarted on the same port and database, so client tests can kill the server mid-run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from noisescope import Api, HTTPTransport
from noisescope_server.cli import server_command

if TYPE_CHECKING:
    import httpx

__all__ = ["ServerProcess", "free_port", "wait_for_health"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_health(
    url: str, timeout: float = 60.0, proc: subprocess.Popen[bytes] | None = None
) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before it was healthy")
        try:
            with urllib.request.urlopen(f"{url}/api/v1/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (OSError, urllib.error.URLError) as exc:
            last = exc
        time.sleep(0.1)
    raise TimeoutError(f"server at {url} not healthy after {timeout}s: {last}")


class ServerProcess:
    """A noisescope server subprocess bound to 127.0.0.1:``port``.

    ``database_url`` defaults to a SQLite file in a fresh temporary directory. Server output
    goes to ``log_path`` (default: in that directory; read it with ``.log()`` when a test
    fails). Extra environment
    variables (e.g. ``NOISESCOPE_ADMIN_TOKEN``) can be passed in ``env``.
    """

    def __init__(
        self,
        database_url: str | None = None,
        port: int | None = None,
        workers: int = 1,
        auth: str = "off",
        env: dict[str, str] | None = None,
        startup_timeout: float = 120.0,
        log_path: Path | None = None,
    ) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="noisescope-server-")
        tmp = Path(self._tmp.name)
        self.database_url = database_url or f"sqlite:///{tmp / 'noisescope.db'}"
        self._auto_port = port is None
        self.port = port or free_port()
        self.workers = workers
        self.auth = auth
        self.env = dict(env or {})
        self.startup_timeout = startup_timeout
        self.log_path = log_path or tmp / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return server_command(
            self.port, auth=self.auth, workers=self.workers, database_url=self.database_url
        )

    def start(self) -> ServerProcess:
        """Start and wait for health. An auto-picked port that another process grabbed in the
        meantime is replaced by a fresh one (up to 3 tries)."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("server already running")
        for attempt in range(3):
            try:
                return self._start_once()
            except RuntimeError as exc:
                in_use = "address already in use" in str(exc).lower()
                if not (in_use and self._auto_port and attempt < 2):
                    raise
                self.port = free_port()
        raise AssertionError("unreachable")

    def _start_once(self) -> ServerProcess:
        env = {**os.environ, "NOISESCOPE_HOME": self._tmp.name, **self.env}
        env.pop("NOISESCOPE_DATABASE_URL", None)
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_for_health(self.url, self.startup_timeout, self.proc)
        except Exception as exc:
            self.kill()
            raise RuntimeError(f"{exc}\n--- server log ---\n{self.log()[offset:]}") from exc
        return self

    def client(self, token: str | None = None, prefix: str = "", **kwargs: Any) -> httpx.Client:
        """An ``httpx.Client`` on the server (``base_url`` is ``url + prefix``, 30 s timeout
        unless given); ``token``: a bearer token on every request. The same call as
        ``AppServer.client`` (harness/inprocess.py)."""
        import httpx  # a test dependency; experiments and benchmarks import this module too

        headers = dict(kwargs.pop("headers", {}) or {})
        if token:
            headers["Authorization"] = f"Bearer {token}"
        kwargs.setdefault("timeout", 30)
        return httpx.Client(base_url=self.url + prefix, headers=headers, **kwargs)

    def transport(self, token: str | None = None) -> HTTPTransport:
        """The client's own ``HTTPTransport`` to the server (as ``AppServer.transport``)."""
        return HTTPTransport(self.url, token)

    def api(self, token: str | None = None, **kwargs: Any) -> Api:
        """``noisescope.Api`` on the server (as ``AppServer.api``)."""
        return Api(self.url, token=token, **kwargs)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def _signal_group(self, sig: int) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)  # workers included

    def stop(self, timeout: float = 15.0) -> None:
        """Graceful stop (SIGINT to the server's process group), SIGKILL after ``timeout``."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self._signal_group(signal.SIGINT)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL the server and its workers: a crash, no shutdown handlers run."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self._signal_group(signal.SIGKILL)
            self.proc.wait(10)
        else:  # the parent is gone; make sure no worker survives
            self._signal_group(signal.SIGKILL)

    def restart(self) -> ServerProcess:
        """Stop (gracefully if still running) and start again on the same port and database."""
        self.stop()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # wait until the port can be bound again
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("127.0.0.1", self.port))
                    break
                except OSError:
                    time.sleep(0.1)
        return self.start()

    def close(self) -> None:
        self.stop()
        self._tmp.cleanup()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()
