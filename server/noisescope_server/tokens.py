"""Reading token metadata (never secrets: only their hashes are stored)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, select

from noisescope_server.models import Project, Token
from noisescope_server.utc import as_utc

__all__ = ["TokenRow", "list_tokens"]


@dataclass(frozen=True)
class TokenRow:
    id: int
    project: str
    name: str
    created_at: datetime
    revoked_at: datetime | None


def list_tokens(engine: Engine, project: str | None = None) -> list[TokenRow]:
    stmt = (
        select(Token.id, Project.name, Token.name, Token.created_at, Token.revoked_at)
        .join(Project, Project.id == Token.project_id)
        .order_by(Token.id)
    )
    if project is not None:
        stmt = stmt.where(Project.name == project)
    with engine.connect() as conn:
        return [
            TokenRow(int(r[0]), str(r[1]), str(r[2]), as_utc(r[3]), as_utc(r[4]))
            for r in conn.execute(stmt)
        ]
