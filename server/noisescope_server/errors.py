"""The domain errors the server raises; ``app`` maps each to its HTTP status."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = [
    "BadInput",
    "Conflict",
    "Forbidden",
    "Gone",
    "NotFound",
    "value_errors_as_bad_input",
]


class BadInput(ValueError):
    """The request is malformed; the message says what to fix. Maps to 4xx (default 422).

    The only error the app turns into a 4xx for bad values: any other ``ValueError`` is a
    server bug and stays a 500.
    """

    def __init__(self, message: str, status_code: int = 422, rows: list[int] | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        #: The indices of every refused sample of a samples body, when the refusal is theirs.
        self.rows = rows


class NotFound(LookupError):
    """Maps to 404."""


class Forbidden(PermissionError):
    """The token may not touch this project. Maps to 403."""


class Gone(LookupError):
    """A write to a run that was deleted (the server remembers its id). Maps to 410."""


class Conflict(ValueError):
    """The request contradicts stored state (e.g. moving a run to another project). 409."""


@contextlib.contextmanager
def value_errors_as_bad_input() -> Iterator[None]:
    """Re-raise a ValueError as BadInput, around a library call that checks request values.

    Only around calls whose ValueErrors are argument checks of what the request gave (the
    ``noisescope.recommend`` functions): anywhere else a ValueError is a server bug, a 500.
    """
    try:
        yield
    except BadInput:
        raise
    except ValueError as exc:
        raise BadInput(str(exc)) from exc
