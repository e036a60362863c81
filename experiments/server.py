"""Start a local noisescope server for the sweep, as a user would (`noisescope server`)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import requests

__all__ = ["LocalServer", "free_port"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class LocalServer:
    """``noisescope server --port P --database-url sqlite:///<db>`` in a child process."""

    def __init__(self, database: Path, log: Path, port: int | None = None) -> None:
        self.database = database
        self.log = log
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> LocalServer:
        self.database.parent.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "noisescope.cli",
            "server",
            "--port",
            str(self.port),
            "--database-url",
            f"sqlite:///{self.database.resolve()}",
        ]
        log = self.log.open("ab")
        self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"`{' '.join(cmd)}` exited with {self._proc.returncode}; see {self.log}"
                )
            try:
                requests.get(self.url + "/api/v1/health", timeout=1.0)
                return self
            except requests.RequestException:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"noisescope server did not answer on {self.url} in {timeout:.0f}s")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
