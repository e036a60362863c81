"""Alembic environment for noisescope.

Used programmatically (``noisescope_server.db.upgrade``): the caller passes an open connection
in ``config.attributes["connection"]`` so migrations run inside the caller's lock and
transaction. Without one (``alembic`` CLI), the URL comes from ``sqlalchemy.url`` or
``NOISESCOPE_DATABASE_URL``.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from noisescope_server.models import Base

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    from noisescope_server.settings import Settings

    return config.get_main_option("sqlalchemy.url") or Settings.from_env().database_url


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    from noisescope_server.db import make_engine

    engine = make_engine(_url())
    with engine.begin() as conn:
        _configure(conn)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
