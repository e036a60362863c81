"""Reading tokens as stored: metadata and the secret's hash, never the secret itself; and
the scopes a token may hold (what each lets it do, and how to ask for one)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, Select, select

from noisescope_server.models import Project, Token
from noisescope_server.utc import as_utc

__all__ = [
    "DEFAULT_SCOPES",
    "SCOPES",
    "TokenRow",
    "list_tokens",
    "live_token",
    "parse_scopes",
    "scopes_text",
]

#: Every scope, in the order they are stored and printed, with what each lets a token do.
SCOPES: dict[str, str] = {
    "read": "read the project's runs, series and recommendations",
    "write": "ingest into the project's runs (create runs, send samples, events, heartbeats, "
    "set a run's status when it ends)",
    "manage": "rename, tag, archive, restore and delete the project's runs",
}
#: What ``token create`` gives without ``--scope``, and what every token made before scopes
#: existed (revision 0004 and older) became: what a training job needs, and no deleting.
DEFAULT_SCOPES: tuple[str, ...] = ("read", "write")


def parse_scopes(text: str | Sequence[str]) -> tuple[str, ...]:
    """Scopes from ``"read,write"``, ``"read write"`` or a list of those, in ``SCOPES`` order;
    ValueError naming the known ones for an unknown or empty one."""
    parts = [text] if isinstance(text, str) else list(text)
    names = {p for part in parts for p in part.replace(",", " ").split()}
    unknown = sorted(names - set(SCOPES))
    if unknown or not names:
        what = f"unknown scope {', '.join(map(repr, unknown))}" if unknown else "no scope given"
        raise ValueError(f"{what}: a token's scopes are any of {', '.join(SCOPES)}")
    return tuple(s for s in SCOPES if s in names)


def scopes_text(scopes: tuple[str, ...] | frozenset[str]) -> str:
    """Scopes as stored: space-separated, in ``SCOPES`` order."""
    return " ".join(s for s in SCOPES if s in scopes)


@dataclass(frozen=True)
class TokenRow:
    """A token of a project; ``revoked_at`` None while it is live."""

    id: int
    name: str
    project_id: int
    project: str
    created_at: datetime
    revoked_at: datetime | None
    #: What it may do (``SCOPES``).
    scopes: frozenset[str] = frozenset(DEFAULT_SCOPES)


def _rows() -> Select[int, str, int, str, datetime, datetime | None, str]:
    return select(
        Token.id,
        Token.name,
        Token.project_id,
        Project.name,
        Token.created_at,
        Token.revoked_at,
        Token.scopes,
    ).join(Project, Project.id == Token.project_id)


def _row(r: Any) -> TokenRow:
    scopes = frozenset(str(r[6]).split())
    return TokenRow(int(r[0]), str(r[1]), int(r[2]), str(r[3]), as_utc(r[4]), as_utc(r[5]), scopes)


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
