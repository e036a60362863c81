"""Timestamps in UTC: the server's one rule for clocks and for datetimes read back from the DB.

SQLite hands back naive datetimes (it stores no zone) and PostgreSQL aware ones; every
timestamp the server writes is UTC, so a naive one is UTC and an aware one is converted.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import overload

__all__ = ["as_utc", "utcnow"]


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


@overload
def as_utc(value: datetime) -> datetime: ...
@overload
def as_utc(value: None) -> None: ...
def as_utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)
