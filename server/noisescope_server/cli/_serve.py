"""``noisescope server``: migrate once, then uvicorn workers sharing one TCP_NODELAY socket."""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys

from noisescope.cli import DEFAULT_PORT
from noisescope_server.cli._database import describe_url, migrate, open_database, settings_from
from noisescope_server.settings import Settings


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

    problem = port_problem(host, port, "server", "--port")
    if problem is not None:
        print(f"noisescope server: {problem}", file=sys.stderr)
        raise SystemExit(2)
    engine = open_database(settings)
    before, after = migrate(engine, settings, "noisescope server")
    engine.dispose()
    print(
        f"noisescope: database {describe_url(settings.database_url)} at revision {after}"
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
        http="noisescope_server._h11:H11Protocol",  # a 400 of uvicorn's ends the request
    )
    sock = bind_socket(host, port)
    print(
        f"noisescope: server on http://{url_host(host)}:{sock.getsockname()[1]} "
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


def url_host(host: str) -> str:
    """The host to put in a printed URL: a wildcard bind is reached at 127.0.0.1."""
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def cmd_server(args: argparse.Namespace) -> int:
    settings = settings_from(args, auth=args.auth, dashboard_url=args.dashboard_url)
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
