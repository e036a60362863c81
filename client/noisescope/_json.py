"""Compact JSON for the wire and the spool: ``orjson`` when installed, else the standard library.

``orjson`` (the server's install has it; ``pip install 'noisescope[fast]'``) encodes float
columns about ten times faster than ``json``, which formats every float with ``repr``; both
write the shortest round-trip form of each number, so what is sent and stored is the same.
"""

from __future__ import annotations

import json
from typing import Any

try:  # optional: the client depends on requests only
    import orjson
except ImportError:  # pragma: no cover - exercised where orjson is not installed
    orjson = None  # type: ignore[assignment]


def dumps(value: Any) -> bytes:
    """Compact JSON. Callers pass finite floats only (columns are checked, events made
    JSON-safe); integers beyond 64 bits, which orjson refuses, take the standard path."""
    if orjson is not None:
        try:
            return bytes(orjson.dumps(value))
        except TypeError:
            pass
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


def jsonable(value: Any) -> Any:
    """A JSON-safe copy of user config (unknown objects become their ``str``)."""
    return json.loads(json.dumps(value, default=str))


def loads(data: bytes) -> Any:
    """Parse JSON (ValueError if it is not)."""
    if orjson is not None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass  # the standard parser decides (and accepts what orjson does not, e.g. big ints)
    return json.loads(data)
