"""Server-side subcommands of the one ``noisescope`` CLI: up, server, dashboard, db, token.

``noisescope_server.cli.register(subparsers)`` is the server distribution's entry in the entry
point group ``noisescope.commands`` (pyproject.toml), through which ``noisescope.cli`` finds it
without importing the server; ``python -m noisescope_server`` runs ``noisescope server``.

- ``_parser``: the argparse wiring of every subcommand (``register``, ``main``);
- ``_serve``: ``server`` (migrate, then uvicorn on one TCP_NODELAY socket) and port checks;
- ``_processes``: ``up`` and ``dashboard``, the server and Streamlit processes they run;
- ``_admin``: ``db`` and ``token``;
- ``_database``: settings and opening a command's database, failures on one line.
"""

from __future__ import annotations

from noisescope_server.cli._parser import main, register
from noisescope_server.cli._processes import (
    dashboard_app,
    dashboard_command,
    dashboard_env,
    server_command,
)
from noisescope_server.cli._serve import bind_socket, serve

__all__ = [
    "bind_socket",
    "dashboard_app",
    "dashboard_command",
    "dashboard_env",
    "main",
    "register",
    "serve",
    "server_command",
]
