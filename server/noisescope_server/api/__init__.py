"""HTTP routers, all mounted under ``/api/v1`` by ``noisescope_server.app.create_app``."""

from __future__ import annotations

from noisescope_server.api import health, ingest, query, runs, tokens

__all__ = ["health", "ingest", "query", "runs", "tokens"]
