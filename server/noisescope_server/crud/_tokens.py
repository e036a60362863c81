"""API tokens' write side: create (the secret shown once, its hash stored) and revoke."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from sqlalchemy import Engine, insert, select, update

from noisescope_server.crud._runs import get_or_create_project
from noisescope_server.db import write_transaction
from noisescope_server.models import Project, Token
from noisescope_server.tokens import DEFAULT_SCOPES, scopes_text
from noisescope_server.utc import utcnow

TOKEN_PREFIX = "nsk_"


def hash_token(secret: str) -> str:
    """sha256 hex of a token secret: what is stored and looked up (the secret never is)."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class TokenCreated:
    id: int
    project: str
    name: str
    scopes: tuple[str, ...]
    #: The secret: shown once, never stored.
    secret: str


def create_token(
    engine: Engine, project: str, name: str = "", scopes: tuple[str, ...] = DEFAULT_SCOPES
) -> TokenCreated:
    """Create an API token for ``project`` (created if missing) with ``scopes`` (checked by
    ``tokens.parse_scopes``); the secret is returned once."""
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with write_transaction(engine) as conn:
        project_id = get_or_create_project(conn, project)
        token_id = conn.execute(
            insert(Token)
            .values(
                project_id=project_id,
                name=name or f"token-{secrets.token_hex(3)}",
                token_hash=hash_token(secret),
                created_at=utcnow(),
                scopes=scopes_text(scopes),
            )
            .returning(Token.id, Token.name)
        ).one()
    return TokenCreated(int(token_id[0]), project, str(token_id[1]), tuple(scopes), secret)


def revoke_token(engine: Engine, token_id: int, *, project: str | None = None) -> bool:
    """Revoke a token at once (every request looks the hash up; nothing caches it)."""
    with write_transaction(engine) as conn:
        stmt = update(Token).where(Token.id == token_id, Token.revoked_at.is_(None))
        if project is not None:
            stmt = stmt.where(
                Token.project_id
                == select(Project.id).where(Project.name == project).scalar_subquery()
            )
        return bool(conn.execute(stmt.values(revoked_at=utcnow())).rowcount)
