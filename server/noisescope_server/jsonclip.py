"""Stored JSON values (run configs, event payloads) made answerable whatever is stored.

Writes refuse a value nested deeper than ``noisescope.protocol.MAX_JSON_DEPTH``; rows stored
before that rule (or written around the API) may nest up to the database's own limit, which
the response encoder cannot write (orjson stops at 254 levels). Reads therefore clip: each
container at the limit's depth that still holds containers is replaced by ``CLIPPED``, and an
object larger than ``protocol.MAX_JSON_BYTES`` (which every run list would carry) by a marker,
and an integer beyond 64 bits (which orjson cannot write) by the float the body parser makes
of one.
"""

from __future__ import annotations

from typing import Any

import orjson

from noisescope import protocol

__all__ = ["CLIPPED", "TOO_LARGE", "TOO_LARGE_KEY", "clip_json", "encode"]

#: What stands in for the part of a stored value nested deeper than the limit.
CLIPPED = f"<nested deeper than {protocol.MAX_JSON_DEPTH} levels: not shown>"
#: What stands in for a stored object larger than ``protocol.MAX_JSON_BYTES``: ``{key: text}``.
TOO_LARGE_KEY = "<not shown>"
TOO_LARGE = f"stored value larger than {protocol.MAX_JSON_BYTES} bytes as JSON"
_INT64_MIN = -(2**63)


def clip_json(value: Any, limit: int = protocol.MAX_JSON_DEPTH) -> Any:
    """``value`` unchanged when it nests at most ``limit`` levels and, being an object, is at
    most ``protocol.MAX_JSON_BYTES`` as JSON; else a copy cut at the limit's depth, or for a too
    large object ``{TOO_LARGE_KEY: TOO_LARGE}``."""
    if protocol.json_depth(value, limit) > limit:
        value = _clip(value, limit)
    try:
        encoded = orjson.dumps(value)
    except TypeError:  # an integer beyond 64 bits, stored around the API
        value = _wide_ints_as_floats(value)
        encoded = orjson.dumps(value)
    if isinstance(value, dict) and len(encoded) > protocol.MAX_JSON_BYTES:
        return {TOO_LARGE_KEY: TOO_LARGE}
    return value


def encode(value: Any) -> bytes:
    """``value`` as JSON; ValueError (bad input, not a server error) for a value JSON written
    by this server cannot carry (an integer beyond 64 bits)."""
    try:
        return orjson.dumps(value)
    except TypeError as exc:
        raise ValueError(f"holds a value the API cannot return ({exc}); use a float") from exc


def _wide_ints_as_floats(value: Any) -> Any:
    # Called on values already clipped to the depth limit, so the recursion is bounded.
    if isinstance(value, dict):
        return {k: _wide_ints_as_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_wide_ints_as_floats(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and not _INT64_MIN <= value < 2**63:
        return float(value)
    return value


def _clip(value: Any, room: int) -> Any:
    # Recursion is bounded by ``room`` (the limit), not by how deep the stored value goes.
    if not isinstance(value, (dict, list)):
        return value
    if room <= 0:
        return CLIPPED
    if isinstance(value, dict):
        return {k: _clip(v, room - 1) for k, v in value.items()}
    return [_clip(v, room - 1) for v in value]
