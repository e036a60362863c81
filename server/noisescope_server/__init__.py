"""noisescope's ingest and query server (FastAPI + SQLAlchemy 2 + Alembic)."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
