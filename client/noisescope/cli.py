"""The one ``noisescope`` command.

The client distribution owns the entry point and its client-side subcommands (``sync``,
``runs``). Other distributions add theirs through the entry point group ``COMMANDS_GROUP``
(``noisescope.commands``): each entry names a ``register(subparsers)`` function. The server
distribution declares one there (``noisescope_server.cli:register``, in the repository's
pyproject.toml), contributing ``up``, ``server``, ``dashboard``, ``db`` and ``token``; this
module never imports the server. Without it those names still appear in ``--help`` and explain
how to install them, rather than failing as unknown.
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

#: The entry point group whose entries (``register(subparsers)`` functions) add subcommands.
COMMANDS_GROUP = "noisescope.commands"
SERVER_COMMANDS = {
    "up": "start the ingest server and the dashboard on a local SQLite database",
    "server": "run the ingest/query HTTP server",
    "dashboard": "run the Streamlit dashboard",
    "db": "database maintenance (upgrade, current)",
    "token": "create, list and revoke project API tokens",
}
SERVER_FIX = "from a noisescope checkout run `pip install ./client .`"
SERVER_INSTALL_HINT = f"this command needs the server distribution; {SERVER_FIX}"


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
    failed = _register_installed(sub)
    for name, help_text in SERVER_COMMANDS.items():
        if name not in sub.choices:  # not installed, or installed but failing to load
            p = sub.add_parser(name, help=f"{help_text} (needs the server install)")
            p.set_defaults(func=_missing_server, failed=failed)
    return parser


def _register_installed(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> list[str]:
    """Let each installed distribution's ``COMMANDS_GROUP`` entry add its subcommands, in the
    order of their names. An entry that fails to load or to register (a distribution half
    installed, removed, or broken) is passed over, so the other commands still work; returns
    what failed and why, for the message of a command it would have added."""
    from importlib import metadata

    failed = []
    for entry in sorted(metadata.entry_points(group=COMMANDS_GROUP), key=lambda e: e.name):
        try:
            register = entry.load()
            register(sub)
        except Exception as exc:  # any failure of another distribution's code
            failed.append(f"{entry.value} failed to load: {type(exc).__name__}: {exc}")
    return failed


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
    failed: list[str] = args.failed
    if failed:  # installed, but broken: reinstalling as the hint says may not be the fix
        print(
            f"noisescope {args.command}: the server distribution is installed but "
            f"{'; '.join(failed)}. Check that its dependencies are installed ({SERVER_FIX})",
            file=sys.stderr,
        )
    else:
        print(f"noisescope {args.command}: {SERVER_INSTALL_HINT}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
