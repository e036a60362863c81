"""Stored JSON values (run configs, event payloads) made answerable whatever is stored.

Writes refuse a value nested deeper than ``noisescope._wire.MAX_JSON_DEPTH``; rows stored
before that rule (or written around the API) may nest up to the database's own limit, which
the response encoder cannot write (orjson stops at 254 levels). Reads therefore clip: each
container at the limit's depth that still holds containers is replaced by ``CLIPPED``, and an
object larger than ``_wire.MAX_JSON_BYTES`` (which every run list would carry) by a marker.
"""

from __future__ import annotations

from typing import Any

import orjson

from noisescope import _wire

__all__ = ["CLIPPED", "TOO_LARGE", "TOO_LARGE_KEY", "clip_json"]

#: What stands in for the part of a stored value nested deeper than the limit.
CLIPPED = f"<nested deeper than {_wire.MAX_JSON_DEPTH} levels: not shown>"
#: What stands in for a stored object larger than ``_wire.MAX_JSON_BYTES``: ``{key: text}``.
TOO_LARGE_KEY = "<not shown>"
TOO_LARGE = f"stored value larger than {_wire.MAX_JSON_BYTES} bytes as JSON"


def clip_json(value: Any, limit: int = _wire.MAX_JSON_DEPTH) -> Any:
    """``value`` unchanged when it nests at most ``limit`` levels and, being an object, is at
    most ``_wire.MAX_JSON_BYTES`` as JSON; else a copy cut at the limit's depth, or for a too
    large object ``{TOO_LARGE_KEY: TOO_LARGE}``."""
    if _wire.json_depth(value, limit) > limit:
        value = _clip(value, limit)
    if isinstance(value, dict) and len(orjson.dumps(value)) > _wire.MAX_JSON_BYTES:
        return {TOO_LARGE_KEY: TOO_LARGE}
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
