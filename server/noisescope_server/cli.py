"""Server-side subcommands of the one ``noisescope`` CLI: up, server, dashboard, db, token.

``noisescope_server.cli.register(subparsers)`` is called by ``noisescope.cli`` when the server
distribution is installed; ``python -m noisescope_server`` runs ``noisescope server``.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from noisescope._config import DEFAULT_URL
from noisescope_server.settings import AUTH_MODES, Settings, default_database_url, parse_auth

if TYPE_CHECKING:
    from sqlalchemy import Engine

__all__ = ["bind_socket", "dashboard_command", "dashboard_env", "main", "register", "serve"]

DEFAULT_PORT = 8765
DEFAULT_DASHBOARD_PORT = 8501
#: uvicorn's log levels, most to least severe.
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
log = logging.getLogger("noisescope_server")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add up/server/dashboard/db/token to the ``noisescope`` parser."""
    up = subparsers.add_parser(
        "up",
        help="start the ingest server and the dashboard on a local SQLite database",
        description=(
            "Zero-setup local mode: applies migrations to a SQLite file (default "
            "~/.noisescope/noisescope.db, or $NOISESCOPE_HOME), starts the ingest server and "
            "the dashboard (a client of the server's HTTP API) on 127.0.0.1 with auth off, and "
            "prints both URLs; training jobs print links to their runs' pages on that dashboard. "
            "Ctrl-C stops both."
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

    dash = subparsers.add_parser(
        "dashboard",
        help="run the Streamlit dashboard",
        description=(
            "Run the Streamlit dashboard: runs, noise-scale charts and recommendations. It reads "
            "everything through a noisescope server's HTTP API, never the database, so it can "
            "run on any machine that reaches the server. Ctrl-C stops it."
        ),
    )
    dash.add_argument(
        "--url",
        type=_http_url,
        help=f"the server to read from (default: $NOISESCOPE_URL, else {DEFAULT_URL})",
    )
    dash.add_argument(
        "--token",
        help=(
            "read token, needed when the server runs with --auth all; a project token shows "
            "that project only (default: $NOISESCOPE_TOKEN, else none; the variable keeps the "
            "secret out of the process list)"
        ),
    )
    dash.add_argument(
        "--port", type=int, default=DEFAULT_DASHBOARD_PORT, help="dashboard port (%(default)s)"
    )
    dash.add_argument("--host", default="127.0.0.1", help="bind address (%(default)s)")
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
    p.add_argument(
        "--dashboard-url",
        type=_http_url,
        help=(
            "the dashboard's base URL: run creation answers carry a link to the run's page, "
            "which the client prints (default: $NOISESCOPE_DASHBOARD_URL, else no links)"
        ),
    )
    p.add_argument("--access-log", action="store_true", help="log every request")
    p.add_argument(
        "--log-level", choices=LOG_LEVELS, default="info", help="uvicorn's log level (%(default)s)"
    )


def _http_url(value: str) -> str:
    """An argparse type: an http(s) base URL, without a trailing slash."""
    if not re.match(r"https?://[^/\s]+", value):
        raise argparse.ArgumentTypeError(f"{value!r} is not an http:// or https:// URL")
    return value.rstrip("/")


def _settings(args: argparse.Namespace, **extra: object) -> Settings:
    """The settings, or one line saying which environment variable is wrong (status 2)."""
    try:
        return Settings.from_env(database_url=getattr(args, "database_url", None), **extra)
    except ValueError as exc:
        print(f"noisescope: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


# --- the database ------------------------------------------------------------------------------


def _open_database(settings: Settings) -> Engine:
    """The engine of ``settings.database_url``, connected once.

    Every command opens its database here, so a bad URL, a missing driver or an unreachable
    database ends any of them the same way: one line naming the URL (password hidden) and what
    is wrong, exit status 2, no traceback from deep inside SQLAlchemy.
    """
    from sqlalchemy.exc import SQLAlchemyError

    from noisescope_server import db

    url = settings.database_url
    try:
        path = db.sqlite_path(url)
        # the default file's directory is created (zero setup); a directory named in a URL
        # given by the user must exist: a typo should not silently start an empty database
        if path is not None and url != default_database_url() and not path.parent.is_dir():
            state = "is not a directory" if path.parent.exists() else "does not exist"
            raise FileNotFoundError(f"directory {path.parent} {state}")
        engine = db.make_engine(url, **_connect_args(url))
        try:
            with engine.connect():
                pass
        except BaseException:
            engine.dispose()
            raise
    except (SQLAlchemyError, ImportError, OSError, ValueError) as exc:
        print(
            f"noisescope: cannot open database {_describe_url(url)}: {_why(exc, url)}",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(2) from None
    return engine


def _connect_args(url: str) -> dict[str, Any]:
    """A bounded first connect on PostgreSQL: libpq's default waits for the OS (minutes)."""
    from sqlalchemy.engine import make_url

    u = make_url(url)
    libpq = u.get_backend_name() == "postgresql" and u.get_driver_name() in ("psycopg", "psycopg2")
    if libpq and "connect_timeout" not in u.query:
        return {"connect_args": {"connect_timeout": 10}}
    return {}


def _why(exc: BaseException, url: str) -> str:
    """What is wrong, on one line, without the URL's password."""
    from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

    if isinstance(exc, NoSuchModuleError):
        scheme = url.partition(":")[0]
        text = f"unknown database kind {scheme!r} (use sqlite:///PATH or postgresql+psycopg://...)"
    elif isinstance(exc, ArgumentError):
        text = "not a database URL (use sqlite:///PATH or postgresql+psycopg://USER@HOST/DB)"
    elif isinstance(exc, ImportError):
        text = f"its driver is not installed ({exc})"
    elif isinstance(exc, DBAPIError):
        text = str(exc.orig)
    elif isinstance(exc, OSError):
        text = f"{exc.strerror}: {exc.filename}" if exc.strerror and exc.filename else str(exc)
    elif isinstance(exc, ValueError):  # half-parsed, e.g. a port that is not a number
        text = f"not a valid URL ({exc})"
    else:
        text = str(exc) or type(exc).__name__
    password = _password(url)
    if password and len(password) >= 3:  # shorter: replacing it would garble the message
        text = text.replace(password, "***")
    return " ".join(text.split())


def _password(url: str) -> str | None:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).password
    except Exception:
        match = re.search(r"://[^:/@]*:([^@]*)@", url)
        return match.group(1) if match else None


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


def port_problem(host: str, port: int, what: str, flag: str) -> str | None:
    """Why ``what`` cannot listen on ``host:port`` (one line naming the option to change),
    or None when the port is free: checked before anything is started or printed."""
    try:
        bind_socket(host, port).close()
    except OSError as exc:
        reason = "is already in use" if exc.errno == errno.EADDRINUSE else f"cannot be used ({exc})"
        return (
            f"port {port} on {host} {reason}, so the {what} cannot start there: stop whatever "
            f"listens on it (another `noisescope up`?) or pass {flag} with a free port"
        )
    return None


def serve(
    settings: Settings,
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    workers: int = 1,
    access_log: bool = False,
    log_level: str = "info",
) -> None:
    """Migrate once, then serve with ``workers`` processes sharing one TCP_NODELAY socket.

    A database that cannot be opened ends the process (status 2) with one line saying why.
    """
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    from noisescope_server import db

    problem = port_problem(host, port, "server", "--port")
    if problem is not None:
        print(f"noisescope server: {problem}", file=sys.stderr)
        raise SystemExit(2)
    engine = _open_database(settings)
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

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not parseable: still never print its password
        return repr(re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url))


def _cmd_server(args: argparse.Namespace) -> int:
    settings = _settings(args, auth=args.auth, dashboard_url=args.dashboard_url)
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


def dashboard_command(port: int, host: str = "127.0.0.1") -> list[str]:
    """The Streamlit command line for the dashboard app shipped with this distribution; the
    server it reads comes from its environment (``dashboard_env``).

    ``toolbarMode minimal`` hides Streamlit's Deploy button and developer menu: they mean
    nothing to someone looking at their runs.
    """
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
    settings = _settings(args, auth="off", dashboard_url=None if args.no_dashboard else dash_url)
    engine = _open_database(settings)
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
                dashboard_command(args.dashboard_port),
                env=dashboard_env(server_url),
                stdout=subprocess.DEVNULL,
            )
            procs.append(dash)
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
    server_url = args.url or (os.environ.get("NOISESCOPE_URL") or DEFAULT_URL).rstrip("/")
    token = args.token if args.token is not None else os.environ.get("NOISESCOPE_TOKEN")
    proc = subprocess.Popen(
        dashboard_command(args.port, args.host), env=dashboard_env(server_url, token)
    )
    print(
        f"noisescope dashboard: http://{_url_host(args.host)}:{args.port} (reading {server_url})",
        flush=True,
    )
    try:
        return proc.wait()
    except KeyboardInterrupt:
        _stop(proc)
        return 0


# --- db / token --------------------------------------------------------------------------------


def _cmd_db_upgrade(args: argparse.Namespace) -> int:
    from noisescope_server import db

    settings = _settings(args)
    engine = _open_database(settings)
    before, after = db.upgrade(engine)
    engine.dispose()
    print(f"{_describe_url(settings.database_url)}: {before or 'empty'} -> {after}")
    return 0


def _cmd_db_current(args: argparse.Namespace) -> int:
    from noisescope_server import db

    engine = _open_database(_settings(args))
    current = db.current_revision(engine)
    engine.dispose()
    head = db.head_revision()
    state = "up to date" if current == head else "needs `noisescope db upgrade`"
    print(f"current: {current or 'empty'}  head: {head}  ({state})")
    return 0


def _engine(args: argparse.Namespace) -> Engine:
    from noisescope_server import db

    engine = _open_database(_settings(args))
    db.upgrade(engine)
    return engine


def _cmd_token_create(args: argparse.Namespace) -> int:
    from noisescope_server import crud

    engine = _engine(args)
    created = crud.create_token(engine, args.project, args.name)
    print(f"token {created.id} ({created.name}) for project {created.project!r}:")
    print(created.secret)
    print("Store it now: it is shown only once (the server keeps only its sha256).")
    return 0


def _cmd_token_list(args: argparse.Namespace) -> int:
    from noisescope_server.tokens import list_tokens

    engine = _engine(args)
    rows = list_tokens(engine, args.project)
    print(f"{'id':>5}  {'project':<20} {'name':<24} {'created':<20} status")
    for t in rows:
        status = f"revoked {t.revoked_at:%Y-%m-%d %H:%M}" if t.revoked_at else "active"
        print(f"{t.id:>5}  {t.project:<20} {t.name:<24} {t.created_at:%Y-%m-%d %H:%M:%S}  {status}")
    return 0


def _cmd_token_revoke(args: argparse.Namespace) -> int:
    from noisescope_server import crud

    engine = _engine(args)
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
