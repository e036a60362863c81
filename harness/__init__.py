"""The shared harness of the tests and the tooling (benchmarks, reliability, experiments,
scripts): noisescope servers to run against, throw-away databases, request bodies, synthetic
runs and the model zoo with its exact noise scale.

Not shipped with either distribution (it lives at the repository root, beside the tooling that
imports it); nothing of the products imports it. The names below are its public face, loaded on
first access (``import harness`` imports neither the server, nor torch, nor hypothesis):

- :class:`ServerProcess`: ``python -m noisescope_server`` in a subprocess on a free port;
  :func:`free_port`, :func:`wait_for_health`.
- :class:`AppServer`: the same app in this process (an ASGI transport, the client's
  ``Transport`` on it, ``noisescope.Api``).
- :func:`fresh_database`: a throw-away PostgreSQL database (``harness.postgres``).
- :func:`columns` and :func:`run_body`: request bodies the server takes (``harness.payloads``).
- :data:`CHROMIUM_ARGS`: headless Chromium's arguments; :data:`QUIET_HF` and
  :data:`QUIET_LIGHTNING`: framework settings that print and save nothing.

Its modules hold the rest: ``broken_http`` and ``loopback`` (a server that answers what a test
scripts), ``hung`` (a server that never answers), ``fault_proxy`` (a proxy in front of the real
server that injects faults or scripted answers), ``small_disk`` (a full disk under the spool),
``spool_layout`` (hostile run ids),
``synthetic_sweep`` (sweeps whose critical batch is known), ``write_then_read`` (hypothesis
stories through every write route, then every read), ``http_clients`` (the httpx client types),
``dashboard_runs``, ``dashboard_stack`` and ``model_sizes`` (the dashboard's synthetic
database, server and Streamlit), ``lsq_branch`` (noisy least squares for branching) and
``zoo`` (the models people train, with the exact noise scale of a finite training set) and
``api_answers`` (a hash of every read's answer on one fixed database, for refactors).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.browser import CHROMIUM_ARGS
    from harness.inprocess import AppServer
    from harness.payloads import columns, run_body
    from harness.postgres import fresh_database
    from harness.servers import ServerProcess, free_port, wait_for_health
    from harness.trainers import QUIET_HF, QUIET_LIGHTNING

__all__ = [
    "CHROMIUM_ARGS",
    "QUIET_HF",
    "QUIET_LIGHTNING",
    "AppServer",
    "ServerProcess",
    "columns",
    "free_port",
    "fresh_database",
    "run_body",
    "wait_for_health",
]

#: Each public name -> the module that defines it.
_HOMES = {
    "CHROMIUM_ARGS": "harness.browser",
    "QUIET_HF": "harness.trainers",
    "QUIET_LIGHTNING": "harness.trainers",
    "AppServer": "harness.inprocess",
    "ServerProcess": "harness.servers",
    "columns": "harness.payloads",
    "free_port": "harness.servers",
    "fresh_database": "harness.postgres",
    "run_body": "harness.payloads",
    "wait_for_health": "harness.servers",
}


def __getattr__(name: str) -> Any:
    """Import a public name's module only when the name is asked for."""
    if name not in _HOMES:
        raise AttributeError(f"module 'harness' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
