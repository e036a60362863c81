"""Reading what a server stored, straight from its database, for tests that check the rows."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

if TYPE_CHECKING:
    from typing import Unpack


def query(db_url: str, sql: str, **params: Any) -> list[sa.Row[Unpack[tuple[Any, ...]]]]:
    """All rows of one SQL query; the engine is opened and disposed here, so no pooled
    connection outlives the read while the server keeps writing to the same database."""
    engine = sa.create_engine(db_url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(sa.text(sql), params).all())
    finally:
        engine.dispose()
