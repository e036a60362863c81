"""The one ``noisescope`` command.

The client distribution owns the entry point and its client-side subcommands (``sync``,
``runs``);
the server distribution, when installed, contributes ``up``, ``server``, ``dashboard``,
``db`` and ``token`` through ``noisescope_server.cli.register``. Without it those names still
appear in ``--help`` and explain how to install them, rather than failing as unknown.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

# What the server's subcommands share with the client (``noisescope_server.cli``): where the
# two meet by default and the one URL check.
from noisescope._config import DEFAULT_DASHBOARD_PORT as DEFAULT_DASHBOARD_PORT
from noisescope._config import DEFAULT_PORT as DEFAULT_PORT
from noisescope._config import DEFAULT_URL as DEFAULT_URL
from noisescope._config import check_url as check_url
from noisescope._config import url_argument as url_argument

SERVER_COMMANDS = {
    "up": "start the ingest server and the dashboard on a local SQLite database",
    "server": "run the ingest/query HTTP server",
    "dashboard": "run the Streamlit dashboard",
    "db": "database maintenance (upgrade, current)",
    "token": "create, list and revoke project API tokens",
}
SERVER_INSTALL_HINT = (
    "this command needs the server distribution; from a noisescope checkout run "
    "`pip install ./client .`"
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="noisescope",
        description=(
            "Track the gradient noise scale of training runs and predict their critical "
            "batch size. Start with `noisescope up`, then add the client to a training loop."
        ),
    )
    parser.add_argument(
        "--version", action="version", version=version(), help="print the installed versions"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    from noisescope._sync import register as register_sync

    register_sync(sub)
    from noisescope._runs_cli import register as register_runs

    register_runs(sub)
    try:
        from noisescope_server.cli import register as register_server
    except ImportError:
        for name, help_text in SERVER_COMMANDS.items():
            p = sub.add_parser(name, help=f"{help_text} (needs the server install)")
            p.set_defaults(func=_missing_server)
    else:
        register_server(sub)
    return parser


def version() -> str:
    """The client's version, and the server distribution's when it is installed (both may be
    installed apart, so a bug report needs both)."""
    from importlib import metadata

    from noisescope import __version__

    try:
        server = f"noisescope-server {metadata.version('noisescope-server')}"
    except metadata.PackageNotFoundError:
        server = "noisescope-server not installed"
    return f"noisescope {__version__} ({server})"


def _missing_server(args: argparse.Namespace) -> int:
    print(f"noisescope {args.command}: {SERVER_INSTALL_HINT}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
