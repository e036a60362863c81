"""``noisescope up`` and ``noisescope dashboard``: start, watch and stop the server and Streamlit
processes."""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from noisescope.cli import DEFAULT_URL, check_url
from noisescope.protocol import redact_text, redact_url
from noisescope_server.cli._database import describe_url, migrate, open_database, settings_from
from noisescope_server.cli._serve import port_problem, url_host


def server_command(
    port: int, *, auth: str = "off", workers: int | None = None, database_url: str | None = None
) -> list[str]:
    """The command line for a server process on 127.0.0.1 (``noisescope up``'s and the tests'),
    logging warnings only; settings not given come from its environment."""
    command = [sys.executable, "-m", "noisescope_server", "--host", "127.0.0.1"]
    command += ["--port", str(port)]
    if workers is not None:
        command += ["--workers", str(workers)]
    command += ["--auth", auth]
    if database_url is not None:
        command += ["--database-url", database_url]
    return [*command, "--log-level", "warning"]


def dashboard_app() -> Path:
    """The dashboard's Streamlit script (``app.py`` of ``noisescope_dashboard``, installed with
    this distribution), found without importing the dashboard: the server imports no dashboard
    code, and Streamlit runs the file in its own process."""
    spec = importlib.util.find_spec("noisescope_dashboard")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(
            "noisescope_dashboard is not installed", name="noisescope_dashboard"
        )
    return Path(spec.origin).with_name("app.py")


def dashboard_command(port: int, host: str = "127.0.0.1") -> list[str]:
    """The Streamlit command line for the dashboard app shipped with this distribution; the
    server it reads comes from its environment (``dashboard_env``).

    ``toolbarMode minimal`` hides Streamlit's Deploy button and developer menu: they mean
    nothing to someone looking at their runs.
    """
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(dashboard_app()),
        "--server.headless",
        "true",
        "--server.port",
        str(port),
        "--server.address",
        host,
        "--browser.gatherUsageStats",
        "false",
        "--client.toolbarMode",
        "minimal",
        "--server.fileWatcherType",
        "none",
    ]


def dashboard_env(
    server_url: str, token: str | None = None, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The dashboard's environment: the server it reads (``NOISESCOPE_URL``) and its read
    token. No database URL: the dashboard reads only through the HTTP API."""
    env = {**(os.environ if base is None else base), "NOISESCOPE_URL": server_url}
    env.pop("NOISESCOPE_DATABASE_URL", None)
    env.pop("NOISESCOPE_TOKEN", None)
    if token:
        env["NOISESCOPE_TOKEN"] = token
    return env


def _wait_http(url: str, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return True
        except OSError:
            time.sleep(0.2)
    return False


def _stop(proc: subprocess.Popen[bytes], timeout: float = 10) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _ended(proc: subprocess.Popen[bytes]) -> str:
    """How a child that is no longer running ended, for a message."""
    code = proc.returncode
    if code is not None and code < 0:
        try:
            return f"was stopped by {signal.Signals(-code).name}"
        except ValueError:
            return f"was stopped by signal {-code}"
    return f"exited with status {code}" + (" (its messages are above)" if code else "")


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def _interrupt_on_termination() -> None:
    """Make SIGTERM/SIGHUP (and a SIGINT ignored by a background shell) stop like Ctrl-C,
    so ``kill`` or a closed terminal never leaves the server and dashboard behind. Only the
    first one interrupts: a second (Ctrl-C twice, ``kill`` then Ctrl-C) would cut short the
    stopping of the children, which ``_stop`` bounds anyway."""

    def interrupt(signum: int, frame: object) -> None:
        for sig in _STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt

    for sig in _STOP_SIGNALS:
        signal.signal(sig, interrupt)


def cmd_up(args: argparse.Namespace) -> int:
    from noisescope_server import db

    _interrupt_on_termination()

    wanted = [(args.port, "ingest server", "--port")]
    if not args.no_dashboard:
        if args.dashboard_port == args.port:
            print("noisescope up: --port and --dashboard-port must differ", file=sys.stderr)
            return 2
        wanted.append((args.dashboard_port, "dashboard", "--dashboard-port"))
    for port, what, flag in wanted:
        problem = port_problem("127.0.0.1", port, what, flag)
        if problem is not None:
            print(f"noisescope up: {problem}", file=sys.stderr)
            return 2

    dash_url = f"http://127.0.0.1:{args.dashboard_port}"
    settings = settings_from(
        args, auth="off", dashboard_url=None if args.no_dashboard else dash_url
    )
    engine = open_database(settings)
    before, after = migrate(engine, settings, "noisescope up")
    engine.dispose()
    path = db.sqlite_path(settings.database_url)
    print(f"noisescope up: database {path if path else describe_url(settings.database_url)}")
    print(
        f"noisescope up: migrations applied ({before or 'empty'} -> {after})"
        if before != after
        else f"noisescope up: database schema is current (revision {after})"
    )
    env = {**os.environ, **settings.to_env()}
    children: dict[str, subprocess.Popen[bytes]] = {}
    try:
        server = children["ingest server"] = subprocess.Popen(server_command(args.port), env=env)
        server_url = f"http://127.0.0.1:{args.port}"
        if not _wait_http(f"{server_url}/api/v1/health", 60, server):
            how = "did not answer within 60 s" if server.poll() is None else _ended(server)
            print(f"noisescope up: the ingest server {how}", file=sys.stderr)
            return 1
        print(f"noisescope up: ingest server  {server_url}   (API docs {server_url}/api/v1/docs)")
        if not args.no_dashboard:
            dash = children["dashboard"] = subprocess.Popen(
                dashboard_command(args.dashboard_port),
                env=dashboard_env(server_url),
                stdout=subprocess.DEVNULL,
            )
            if _wait_http(f"{dash_url}/_stcore/health", 90, dash):
                print(f"noisescope up: dashboard      {dash_url}")
            elif dash.poll() is None:
                print("noisescope up: the dashboard did not answer within 90 s", file=sys.stderr)
        if all(p.poll() is None for p in children.values()):
            print(
                "noisescope up: auth is off and both listen on 127.0.0.1 only; "
                f'point the client at url="{server_url}". Ctrl-C stops both.',
                flush=True,
            )
        while all(p.poll() is None for p in children.values()):
            time.sleep(0.5)
        name, gone = next((n, p) for n, p in children.items() if p.poll() is not None)
        others = [n for n, p in children.items() if p.poll() is None]
        stopping = f"; stopping the {' and the '.join(others)}" if others else ""
        print(f"noisescope up: the {name} (pid {gone.pid}) {_ended(gone)}{stopping}",
              file=sys.stderr, flush=True)  # fmt: skip
        return 1
    except KeyboardInterrupt:
        print("\nnoisescope up: stopping", flush=True)
        return 0
    finally:
        for p in reversed(children.values()):
            _stop(p)


def cmd_dashboard(args: argparse.Namespace) -> int:
    try:
        server_url = args.url or check_url(os.environ.get("NOISESCOPE_URL") or DEFAULT_URL)
    except ValueError as exc:
        print(f"noisescope dashboard: {redact_text(str(exc))}", file=sys.stderr)
        return 2
    token = args.token if args.token is not None else os.environ.get("NOISESCOPE_TOKEN")
    _interrupt_on_termination()
    proc: subprocess.Popen[bytes] | None = None
    try:
        proc = subprocess.Popen(
            dashboard_command(args.port, args.host), env=dashboard_env(server_url, token)
        )
        print(
            f"noisescope dashboard: http://{url_host(args.host)}:{args.port} "
            f"(reading {redact_url(server_url)})",  # a password in the URL is not printed
            flush=True,
        )
        if proc.wait() == 0:
            return 0
        print(f"noisescope dashboard: Streamlit (pid {proc.pid}) {_ended(proc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        if proc is not None:
            _stop(proc)
