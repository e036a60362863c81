"""Token checks. Secrets are compared by their sha256 (what is stored), looked up on every
request so a revoke takes effect at once on every worker; secrets are never logged."""

from __future__ import annotations

from sqlalchemy import Engine

from noisescope_server.crud import hash_token
from noisescope_server.tokens import TokenRow, live_token

__all__ = ["resolve_token"]


def resolve_token(engine: Engine, secret: str) -> TokenRow | None:
    """The live (not revoked) token with this secret, or None."""
    return live_token(engine, hash_token(secret))
