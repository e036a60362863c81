"""Reading tokens as stored: metadata and the secret's hash, never the secret itself."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, Select, select

from noisescope_server.models import Project, Token
from noisescope_server.utc import as_utc

__all__ = ["TokenRow", "list_tokens", "live_token"]


@dataclass(frozen=True)
class TokenRow:
    """A token of a project; ``revoked_at`` None while it is live."""

    id: int
    name: str
    project_id: int
    project: str
    created_at: datetime
    revoked_at: datetime | None


def _rows() -> Select[int, str, int, str, datetime, datetime | None]:
    return select(
        Token.id, Token.name, Token.project_id, Project.name, Token.created_at, Token.revoked_at
    ).join(Project, Project.id == Token.project_id)


def _row(r: Any) -> TokenRow:
    return TokenRow(int(r[0]), str(r[1]), int(r[2]), str(r[3]), as_utc(r[4]), as_utc(r[5]))


def list_tokens(engine: Engine, project: str | None = None) -> list[TokenRow]:
    stmt = _rows().order_by(Token.id)
    if project is not None:
        stmt = stmt.where(Project.name == project)
    with engine.connect() as conn:
        return [_row(r) for r in conn.execute(stmt)]


def live_token(engine: Engine, token_hash: str) -> TokenRow | None:
    """The token whose secret hashes to ``token_hash``, unless revoked."""
    with engine.connect() as conn:
        row = conn.execute(
            _rows().where(Token.token_hash == token_hash, Token.revoked_at.is_(None))
        ).first()
    return None if row is None else _row(row)
