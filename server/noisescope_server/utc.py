"""Timestamps in UTC: the server's one rule for clocks and for datetimes read back from the DB.

SQLite hands back naive datetimes (it stores no zone) and PostgreSQL aware ones; every
timestamp the server writes is UTC, so a naive one is UTC and an aware one is converted.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import overload

__all__ = ["as_utc", "in_utc_range", "utcnow"]


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


def in_utc_range(value: datetime) -> datetime:
    """``value`` when it has a UTC time (what is stored), else ValueError naming the range: an
    offset can carry a time at the calendar's ends out of it (9999-12-31T23:00-14:00)."""
    try:
        as_utc(value)
    except OverflowError:
        raise ValueError(
            "is outside the times the server can store: 0001-01-01 to 9999-12-31 in UTC, "
            "after its offset is applied"
        ) from None
    return value
