"""Server-side subcommands of the one ``noisescope`` CLI: up, server, dashboard, db, token.

``noisescope_server.cli.register(subparsers)`` is called by ``noisescope.cli`` when the server
distribution is installed; ``python -m noisescope_server`` runs ``noisescope server``.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from noisescope_server.settings import AUTH_MODES, Settings, parse_auth

__all__ = ["bind_socket", "main", "register", "serve"]

DEFAULT_PORT = 8765
DEFAULT_DASHBOARD_PORT = 8501
log = logging.getLogger("noisescope_server")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add up/server/dashboard/db/token to the ``noisescope`` parser."""
    up = subparsers.add_parser(
        "up",
        help="start the ingest server and the dashboard on a local SQLite database",
        description=(
            "Zero-setup local mode: applies migrations to a SQLite file (default "
            "~/.noisescope/noisescope.db, or $NOISESCOPE_HOME), starts the ingest server and "
            "the dashboard on 127.0.0.1 with auth off, and prints both URLs. Ctrl-C stops both."
        ),
    )
    up.add_argument("--port", type=int, default=DEFAULT_PORT, help="server port (%(default)s)")
    up.add_argument(
        "--dashboard-port",
        type=int,
        default=DEFAULT_DASHBOARD_PORT,
        help="dashboard port (%(default)s)",
    )
    up.add_argument("--database-url", help="SQLAlchemy URL (default: the local SQLite file)")
    up.add_argument("--no-dashboard", action="store_true", help="start only the server")
    up.set_defaults(func=_cmd_up)

    server = subparsers.add_parser(
        "server",
        help="run the ingest/query HTTP server",
        description=(
            "Run the HTTP server. For teams: PostgreSQL via --database-url, several --workers, "
            "--auth write, TLS at a reverse proxy (docs/deployment.md)."
        ),
    )
    _server_args(server)
    server.set_defaults(func=_cmd_server)

    dash = subparsers.add_parser("dashboard", help="run the Streamlit dashboard")
    dash.add_argument("--port", type=int, default=DEFAULT_DASHBOARD_PORT)
    dash.add_argument("--host", default="127.0.0.1")
    dash.add_argument("--database-url", help="SQLAlchemy URL (default: $NOISESCOPE_DATABASE_URL)")
    dash.set_defaults(func=_cmd_dashboard)

    dbp = subparsers.add_parser("db", help="database maintenance (upgrade, current)")
    dbp.add_argument("--database-url", help="SQLAlchemy URL (default: $NOISESCOPE_DATABASE_URL)")
    dbsub = dbp.add_subparsers(dest="db_command", metavar="ACTION")
    dbsub.required = True
    dbsub.add_parser("upgrade", help="apply migrations up to head").set_defaults(
        func=_cmd_db_upgrade
    )
    dbsub.add_parser("current", help="print the current and head revisions").set_defaults(
        func=_cmd_db_current
    )

    tok = subparsers.add_parser("token", help="create, list and revoke project API tokens")
    tok.add_argument("--database-url", help="SQLAlchemy URL (default: $NOISESCOPE_DATABASE_URL)")
    toksub = tok.add_subparsers(dest="token_command", metavar="ACTION")
    toksub.required = True
    create = toksub.add_parser("create", help="create a token; the secret is printed once")
    create.add_argument("--project", required=True)
    create.add_argument("--name", default="")
    create.set_defaults(func=_cmd_token_create)
    lst = toksub.add_parser("list", help="list tokens (never their secrets)")
    lst.add_argument("--project")
    lst.set_defaults(func=_cmd_token_list)
    rev = toksub.add_parser("revoke", help="revoke a token at once")
    rev.add_argument("token_id", type=int)
    rev.add_argument("--project", help="only revoke if the token belongs to this project")
    rev.set_defaults(func=_cmd_token_revoke)
    # `noisescope token create --project P --database-url URL` (option after the action) works
    # too; SUPPRESS keeps a value given before the action when it is not repeated after it
    for action in (*dbsub.choices.values(), create, lst, rev):
        action.add_argument(
            "--database-url",
            default=argparse.SUPPRESS,
            help="SQLAlchemy URL (also accepted before the action)",
        )


def _server_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="bind address (%(default)s)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="(%(default)s)")
    p.add_argument("--database-url", help="SQLAlchemy URL (default: $NOISESCOPE_DATABASE_URL)")
    p.add_argument("--workers", type=int, default=1, help="worker processes (%(default)s)")
    p.add_argument(
        "--auth",
        type=parse_auth,
        help=f"one of {', '.join(AUTH_MODES)} (default: $NOISESCOPE_AUTH or off)",
    )
    p.add_argument("--access-log", action="store_true", help="log every request")
    p.add_argument("--log-level", default="info")


def _settings(args: argparse.Namespace, **extra: object) -> Settings:
    return Settings.from_env(database_url=getattr(args, "database_url", None), **extra)


# --- serving -----------------------------------------------------------------------------------


def bind_socket(host: str, port: int) -> socket.socket:
    """The listening socket, with TCP_NODELAY set on it (accepted sockets inherit it on Linux).

    uvicorn binds its own socket for ``--workers N`` without TCP_NODELAY (uvicorn issue 3149):
    keep-alive clients then stall ~40 ms per request on delayed ACKs. Binding here, once, in the
    parent, and handing the socket to every worker avoids that (``benchmarks/ingest.py`` measures
    per-request latency with several workers).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve(
    settings: Settings,
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    workers: int = 1,
    access_log: bool = False,
    log_level: str = "info",
) -> None:
    """Migrate once, then serve with ``workers`` processes sharing one TCP_NODELAY socket."""
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    from noisescope_server import db

    engine = db.make_engine(settings.database_url)
    before, after = db.upgrade(engine)
    engine.dispose()
    print(
        f"noisescope: database {_describe_url(settings.database_url)} at revision {after}"
        + (f" (migrated from {before or 'empty'})" if before != after else ""),
        flush=True,
    )
    os.environ.update(settings.to_env())  # workers build their app from the environment
    config = uvicorn.Config(
        "noisescope_server.app:app_from_env",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        access_log=access_log,
        log_level=log_level,
        timeout_keep_alive=30,
    )
    sock = bind_socket(host, port)
    print(
        f"noisescope: server on http://{_url_host(host)}:{sock.getsockname()[1]} "
        f"({workers} worker{'s' if workers > 1 else ''}, auth {settings.auth})",
        flush=True,
    )
    try:
        if workers > 1:
            Multiprocess(config, sockets=[sock]).run()
        else:
            uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:  # Ctrl-C: uvicorn has already shut down cleanly
        pass
    finally:
        sock.close()


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def _describe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def _cmd_server(args: argparse.Namespace) -> int:
    settings = _settings(args, auth=args.auth)
    if args.workers < 1:
        print("noisescope server: --workers must be at least 1", file=sys.stderr)
        return 2
    serve(
        settings,
        host=args.host,
        port=args.port,
        workers=args.workers,
        access_log=args.access_log,
        log_level=args.log_level,
    )
    return 0


# --- up / dashboard ----------------------------------------------------------------------------


def dashboard_command(database_url: str, port: int, host: str = "127.0.0.1") -> list[str]:
    """The Streamlit command line for the dashboard app shipped with this distribution."""
    import noisescope_dashboard

    app = Path(noisescope_dashboard.__file__).with_name("app.py")
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(app),
        "--server.headless",
        "true",
        "--server.port",
        str(port),
        "--server.address",
        host,
        "--browser.gatherUsageStats",
        "false",
        "--server.fileWatcherType",
        "none",
    ]


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


def _interrupt_on_termination() -> None:
    """Make SIGTERM/SIGHUP (and a SIGINT ignored by a background shell) stop like Ctrl-C,
    so ``kill`` or a closed terminal never leaves the server and dashboard behind."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, interrupt)


def _cmd_up(args: argparse.Namespace) -> int:
    from noisescope_server import db

    _interrupt_on_termination()

    settings = _settings(args, auth="off")
    engine = db.make_engine(settings.database_url)
    before, after = db.upgrade(engine)
    engine.dispose()
    path = db.sqlite_path(settings.database_url)
    print(f"noisescope up: database {path if path else _describe_url(settings.database_url)}")
    print(
        f"noisescope up: migrations applied ({before or 'empty'} -> {after})"
        if before != after
        else f"noisescope up: database schema is current (revision {after})"
    )
    env = {**os.environ, **settings.to_env()}
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "noisescope_server",
            "--host",
            "127.0.0.1",
            "--port",
            str(args.port),
            "--auth",
            "off",
            "--log-level",
            "warning",
        ],
        env=env,
    )
    procs = [server]
    try:
        server_url = f"http://127.0.0.1:{args.port}"
        if not _wait_http(f"{server_url}/api/v1/health", 60, server):
            print(
                "noisescope up: the server did not start (see the messages above)", file=sys.stderr
            )
            return 1
        print(f"noisescope up: ingest server  {server_url}   (API docs {server_url}/api/v1/docs)")
        if not args.no_dashboard:
            dash = subprocess.Popen(
                dashboard_command(settings.database_url, args.dashboard_port),
                env=env,
                stdout=subprocess.DEVNULL,
            )
            procs.append(dash)
            dash_url = f"http://127.0.0.1:{args.dashboard_port}"
            if _wait_http(f"{dash_url}/_stcore/health", 90, dash):
                print(f"noisescope up: dashboard      {dash_url}")
            else:
                print("noisescope up: the dashboard did not start", file=sys.stderr)
        print(
            "noisescope up: auth is off and both listen on 127.0.0.1 only; "
            f'point the client at url="{server_url}". Ctrl-C stops both.',
            flush=True,
        )
        while all(p.poll() is None for p in procs):
            time.sleep(0.5)
        return 1  # one of them exited on its own
    except KeyboardInterrupt:
        print("\nnoisescope up: stopping", flush=True)
        return 0
    finally:
        for p in reversed(procs):
            _stop(p)


def _cmd_dashboard(args: argparse.Namespace) -> int:
    settings = _settings(args)
    env = {**os.environ, **settings.to_env()}
    proc = subprocess.Popen(dashboard_command(settings.database_url, args.port, args.host), env=env)
    print(f"noisescope dashboard: http://{_url_host(args.host)}:{args.port}", flush=True)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        _stop(proc)
        return 0


# --- db / token --------------------------------------------------------------------------------


def _cmd_db_upgrade(args: argparse.Namespace) -> int:
    from noisescope_server import db

    settings = _settings(args)
    engine = db.make_engine(settings.database_url)
    before, after = db.upgrade(engine)
    engine.dispose()
    print(f"{_describe_url(settings.database_url)}: {before or 'empty'} -> {after}")
    return 0


def _cmd_db_current(args: argparse.Namespace) -> int:
    from noisescope_server import db

    settings = _settings(args)
    engine = db.make_engine(settings.database_url)
    current = db.current_revision(engine)
    engine.dispose()
    head = db.head_revision()
    state = "up to date" if current == head else "needs `noisescope db upgrade`"
    print(f"current: {current or 'empty'}  head: {head}  ({state})")
    return 0


def _engine(args: argparse.Namespace) -> object:
    from noisescope_server import db

    engine = db.make_engine(_settings(args).database_url)
    db.upgrade(engine)
    return engine


def _cmd_token_create(args: argparse.Namespace) -> int:
    from sqlalchemy import Engine

    from noisescope_server import crud

    engine = _engine(args)
    assert isinstance(engine, Engine)
    created = crud.create_token(engine, args.project, args.name)
    print(f"token {created.id} ({created.name}) for project {created.project!r}:")
    print(created.secret)
    print("Store it now: it is shown only once (the server keeps only its sha256).")
    return 0


def _cmd_token_list(args: argparse.Namespace) -> int:
    from sqlalchemy import Engine

    from noisescope_server.tokens import list_tokens

    engine = _engine(args)
    assert isinstance(engine, Engine)
    rows = list_tokens(engine, args.project)
    print(f"{'id':>5}  {'project':<20} {'name':<24} {'created':<20} status")
    for t in rows:
        status = f"revoked {t.revoked_at:%Y-%m-%d %H:%M}" if t.revoked_at else "active"
        print(f"{t.id:>5}  {t.project:<20} {t.name:<24} {t.created_at:%Y-%m-%d %H:%M:%S}  {status}")
    return 0


def _cmd_token_revoke(args: argparse.Namespace) -> int:
    from sqlalchemy import Engine

    from noisescope_server import crud

    engine = _engine(args)
    assert isinstance(engine, Engine)
    if crud.revoke_token(engine, args.token_id, project=args.project):
        print(f"token {args.token_id} revoked")
        return 0
    print(
        f"no active token {args.token_id}"
        + (f" in project {args.project!r}" if args.project else ""),
        file=sys.stderr,
    )
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m noisescope_server``: the same as ``noisescope server``."""
    parser = argparse.ArgumentParser(
        prog="python -m noisescope_server", description="noisescope server"
    )
    _server_args(parser)
    args = parser.parse_args(argv)
    return _cmd_server(args)
