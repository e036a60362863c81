"""Token checks. Secrets are compared by their sha256 (what is stored), looked up on every
request so a revoke takes effect at once on every worker; secrets are never logged."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine, select

from noisescope_server.crud import hash_token
from noisescope_server.models import Project, Token

__all__ = ["TokenInfo", "resolve_token"]


@dataclass(frozen=True)
class TokenInfo:
    id: int
    name: str
    project_id: int
    project: str


def resolve_token(engine: Engine, secret: str) -> TokenInfo | None:
    """The live (not revoked) token with this secret, or None."""
    with engine.connect() as conn:
        row = conn.execute(
            select(Token.id, Token.name, Token.project_id, Project.name)
            .join(Project, Project.id == Token.project_id)
            .where(Token.token_hash == hash_token(secret), Token.revoked_at.is_(None))
        ).first()
    return None if row is None else TokenInfo(int(row[0]), str(row[1]), int(row[2]), str(row[3]))
