"""Throw-away PostgreSQL databases for tests, benchmarks and the reliability harness."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["connect", "fresh_database"]


def connect(url: str, timeout: float = 5) -> Any:
    """An autocommit psycopg connection to the server and database named by a SQLAlchemy URL."""
    import psycopg
    from sqlalchemy.engine import make_url

    u = make_url(url)
    return psycopg.connect(
        host=u.host or "127.0.0.1",
        port=u.port or 5432,
        user=u.username or "postgres",
        password=u.password,
        dbname=u.database or "postgres",
        autocommit=True,
        connect_timeout=int(timeout),
    )


@contextlib.contextmanager
def fresh_database(
    admin_url: str, prefix: str, before_drop: Callable[[], object] | None = None
) -> Iterator[str]:
    """Create an empty database ``<prefix>_<random>``, yield its URL, drop it afterwards.

    ``before_drop`` runs first on the way out (e.g. wait for a server a test restarted).
    """
    from sqlalchemy.engine import make_url

    name = f"{prefix}_{secrets.token_hex(6)}"
    with connect(admin_url) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        if before_drop is not None:
            before_drop()
        with connect(admin_url) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
