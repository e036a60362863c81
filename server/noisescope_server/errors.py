"""The domain errors the server raises; ``app`` maps each to its HTTP status."""

from __future__ import annotations

__all__ = ["BadInput", "Conflict", "Forbidden", "NotFound"]


class BadInput(ValueError):
    """The request is malformed; the message says what to fix. Maps to 4xx (default 422)."""

    def __init__(self, message: str, status_code: int = 422) -> None:
        super().__init__(message)
        self.status_code = status_code


class NotFound(LookupError):
    """Maps to 404."""


class Forbidden(PermissionError):
    """The token may not touch this project. Maps to 403."""


class Conflict(ValueError):
    """The request contradicts stored state (e.g. moving a run to another project). 409."""
