"""The argparse wiring: each server subcommand, its options and the function it runs."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from noisescope.cli import (
    DEFAULT_DASHBOARD_PORT,
    DEFAULT_PORT,
    DEFAULT_URL,
    SERVER_COMMANDS,
    url_argument,
)
from noisescope_server.chunks import CHUNK_ROWS
from noisescope_server.cli._admin import (
    cmd_db_compact,
    cmd_db_current,
    cmd_db_upgrade,
    cmd_token_create,
    cmd_token_list,
    cmd_token_revoke,
)
from noisescope_server.cli._processes import cmd_dashboard, cmd_up
from noisescope_server.cli._serve import cmd_server
from noisescope_server.settings import AUTH_MODES, COMPACT_QUIET_AFTER, parse_auth

#: uvicorn's log levels, most to least severe.
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add up/server/dashboard/db/token to the ``noisescope`` parser, with the help lines the
    client shows for them without the server install (``noisescope.cli.SERVER_COMMANDS``)."""
    up = _command(
        subparsers,
        "up",
        cmd_up,
        SERVER_COMMANDS["up"],
        "Zero-setup local mode: applies migrations to a SQLite file (default "
        "~/.noisescope/noisescope.db, or $NOISESCOPE_HOME), starts the ingest server and "
        "the dashboard (a client of the server's HTTP API) on 127.0.0.1 with auth off, and "
        "prints both URLs; training jobs print links to their runs' pages on that dashboard. "
        "Ctrl-C stops both.",
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

    server = _command(
        subparsers,
        "server",
        cmd_server,
        SERVER_COMMANDS["server"],
        "Run the HTTP server. For teams: PostgreSQL via --database-url, several --workers, "
        "--auth write, TLS at a reverse proxy (docs/deployment.md).",
    )
    _server_args(server)

    dash = _command(
        subparsers,
        "dashboard",
        cmd_dashboard,
        SERVER_COMMANDS["dashboard"],
        "Run the Streamlit dashboard: runs, noise-scale charts and recommendations. It reads "
        "everything through a noisescope server's HTTP API, never the database, so it can "
        "run on any machine that reaches the server. Ctrl-C stops it.",
    )
    dash.add_argument(
        "--url",
        type=url_argument,
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

    dbp = subparsers.add_parser("db", help=SERVER_COMMANDS["db"])
    dbp.add_argument("--database-url", help="SQLAlchemy URL (default: $NOISESCOPE_DATABASE_URL)")
    dbsub = dbp.add_subparsers(dest="db_command", metavar="ACTION")
    dbsub.required = True
    _command(dbsub, "upgrade", cmd_db_upgrade, "apply migrations up to head")
    _command(dbsub, "current", cmd_db_current, "print the current and head revisions")
    compact = _command(
        dbsub,
        "compact",
        cmd_db_compact,
        "move finished runs' samples into compressed chunks now (the server does it by itself)",
    )
    compact.add_argument(
        "--run", action="append", metavar="RUN_ID", help="this run only, finished or not (repeat)"
    )
    compact.add_argument(
        "--quiet-after",
        type=float,
        default=COMPACT_QUIET_AFTER,
        metavar="SECONDS",
        help="without --run: also runs silent this long, whatever their status (%(default).0f)",
    )
    compact.add_argument(
        "--chunk-rows",
        type=int,
        default=CHUNK_ROWS,
        metavar="N",
        help="samples per chunk at most (%(default)s)",
    )

    tok = subparsers.add_parser("token", help=SERVER_COMMANDS["token"])
    tok.add_argument("--database-url", help="SQLAlchemy URL (default: $NOISESCOPE_DATABASE_URL)")
    toksub = tok.add_subparsers(dest="token_command", metavar="ACTION")
    toksub.required = True
    create = _command(
        toksub, "create", cmd_token_create, "create a token; the secret is printed once"
    )
    create.add_argument("--project", required=True)
    create.add_argument("--name", default="")
    create.add_argument(
        "--scope",
        action="append",
        metavar="SCOPE",
        help="what the token may do, repeatable or comma-separated: read; write (ingest into "
        "the project's runs); manage (rename, tag, archive, restore, delete runs). Default: "
        "read,write (a training job). The dashboard needs only read",
    )
    lst = _command(toksub, "list", cmd_token_list, "list tokens (never their secrets)")
    lst.add_argument("--project")
    rev = _command(toksub, "revoke", cmd_token_revoke, "revoke a token at once")
    rev.add_argument("token_id", type=int)
    rev.add_argument("--project", help="only revoke if the token belongs to this project")
    # `noisescope token create --project P --database-url URL` (option after the action) works
    # too; SUPPRESS keeps a value given before the action when it is not repeated after it
    for action in (*dbsub.choices.values(), create, lst, rev):
        action.add_argument(
            "--database-url",
            default=argparse.SUPPRESS,
            help="SQLAlchemy URL (also accepted before the action)",
        )


def _command(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    func: Callable[[argparse.Namespace], int],
    help: str,
    description: str | None = None,
) -> argparse.ArgumentParser:
    """The subcommand ``name``, which runs ``func``; ``help`` is its line in the list and,
    without a ``description``, its description too."""
    command = subparsers.add_parser(name, help=help, description=description or help)
    command.set_defaults(func=func)
    return command


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
        type=url_argument,
        help=(
            "the dashboard's base URL: run creation answers carry a link to the run's page, "
            "which the client prints (default: $NOISESCOPE_DASHBOARD_URL, else no links)"
        ),
    )
    p.add_argument("--access-log", action="store_true", help="log every request")
    p.add_argument(
        "--log-level", choices=LOG_LEVELS, default="info", help="uvicorn's log level (%(default)s)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m noisescope_server``: the same as ``noisescope server``."""
    parser = argparse.ArgumentParser(
        prog="python -m noisescope_server", description="noisescope server"
    )
    _server_args(parser)
    args = parser.parse_args(argv)
    return cmd_server(args)
