"""A real server on synthetic data and the dashboard reading it, for the browser test and for
``scripts/dashboard_screenshots.py``: both drive the same stack through Playwright.

The server is ``harness.servers.ServerProcess``; the dashboard is started with the
command line and environment ``noisescope dashboard`` uses (``dashboard_command``,
``dashboard_env``: only ``NOISESCOPE_URL`` and ``NOISESCOPE_TOKEN``), so what the browser sees
is what a user's ``noisescope up`` serves.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from harness.browser import CHROMIUM_ARGS
from harness.dashboard_runs import default_runs, insert_runs
from harness.servers import ServerProcess, free_port
from noisescope_server.cli._processes import dashboard_app, dashboard_command, dashboard_env

__all__ = [
    "Stack",
    "chromium",
    "dashboard",
    "fit_height",
    "local_only",
    "open_page",
    "stack",
]

READY = "[data-testid='stApp'][data-test-script-state='notRunning']"


def chromium() -> str | None:
    """Debian's Chromium (never a downloaded browser)."""
    return shutil.which("chromium") or (
        "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None
    )


def _wait(url: str, proc: subprocess.Popen[bytes], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the dashboard exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"{url} did not answer within {timeout} s")


@contextlib.contextmanager
def dashboard(
    server_url: str, log: Path, token: str | None = None, *, code: Path | None = None
) -> Iterator[str]:
    """``streamlit run app.py`` reading ``server_url``; yields the dashboard's base URL.
    ``code``: the root of another checkout whose dashboard (and client) runs instead, first on
    ``PYTHONPATH`` (a benchmark's earlier version)."""
    port = free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith("NOISESCOPE_")}
    env = dashboard_env(server_url, token, base)
    command = dashboard_command(port)
    if code is not None:
        env["PYTHONPATH"] = os.pathsep.join(str(code / d) for d in ("client", "dashboard"))
        app = command.index(str(dashboard_app()))
        command[app] = str(code / "dashboard" / "noisescope_dashboard" / "app.py")
    with log.open("wb") as out:
        proc = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            _wait(f"http://127.0.0.1:{port}/_stcore/health", proc)
            yield f"http://127.0.0.1:{port}"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


class Stack:
    """The server (``server``) on a synthetic database and the dashboard (``base``)."""

    def __init__(self, server: ServerProcess, base: str, workdir: Path) -> None:
        self.server = server
        self.base = base
        self.workdir = workdir


@contextlib.contextmanager
def stack(workdir: Path | None = None) -> Iterator[Stack]:
    """A fresh synthetic database (``_synth.default_runs``), a server and the dashboard."""
    with contextlib.ExitStack() as stack_:
        if workdir is None:
            workdir = Path(stack_.enter_context(tempfile.TemporaryDirectory(prefix="dash-")))
        db = workdir / "noisescope.db"
        db.unlink(missing_ok=True)
        url = f"sqlite:///{db}"
        insert_runs(url, default_runs())
        server = stack_.enter_context(ServerProcess(url))
        base = stack_.enter_context(dashboard(server.url, workdir / "dashboard.log"))
        yield Stack(server, base, workdir)


def local_only(url: str) -> bool:
    """Whether a request stays on this machine."""
    host = urlparse(url).hostname
    return url.startswith(("data:", "blob:", "about:")) or host in ("127.0.0.1", "localhost")


def open_page(page: Any, url: str, *, charts: bool = True, settle_ms: int = 1200) -> None:
    """Go to ``url`` and wait until the script finished and, with ``charts``, Vega drew."""
    page.goto(url, wait_until="domcontentloaded")
    page.wait_for_selector(READY, timeout=90_000)
    if charts:
        page.wait_for_selector(
            "[data-testid='stVegaLiteChart'] canvas, [data-testid='stVegaLiteChart'] svg",
            timeout=60_000,
        )
    page.wait_for_timeout(settle_ms)  # Vega's last frame, fonts
    page.wait_for_selector(READY, timeout=90_000)


def fit_height(page: Any, width: int = 1400) -> None:
    """Grow the viewport to the page's whole height: Streamlit scrolls inside its own
    container, so a full-page screenshot of a short viewport would cut the page off."""
    height = page.evaluate(
        "Math.max(...[...document.querySelectorAll('[data-testid=stMain], "
        "[data-testid=stAppViewContainer], section')].map(e => e.scrollHeight), 800)"
    )
    page.set_viewport_size({"width": width, "height": int(height) + 40})
    page.wait_for_timeout(1500)  # charts redraw at the new size
    page.wait_for_selector(READY, timeout=90_000)


def browser(playwright: Any, executable: str) -> Any:
    return playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
