"""Stored JSON values (run configs, event payloads) made answerable whatever is stored.

Writes refuse a value nested deeper than ``noisescope._wire.MAX_JSON_DEPTH``; rows stored
before that rule (or written around the API) may nest up to the database's own limit, which
the response encoder cannot write (orjson stops at 254 levels). Reads therefore clip: each
container at the limit's depth that still holds containers is replaced by ``CLIPPED``.
"""

from __future__ import annotations

from typing import Any

from noisescope import _wire

__all__ = ["CLIPPED", "clip_json"]

#: What stands in for the part of a stored value nested deeper than the limit.
CLIPPED = f"<nested deeper than {_wire.MAX_JSON_DEPTH} levels: not shown>"


def clip_json(value: Any, limit: int = _wire.MAX_JSON_DEPTH) -> Any:
    """``value`` unchanged when it nests at most ``limit`` levels, else a copy cut there."""
    if _wire.json_depth(value, limit) <= limit:
        return value
    return _clip(value, limit)


def _clip(value: Any, room: int) -> Any:
    # Recursion is bounded by ``room`` (the limit), not by how deep the stored value goes.
    if not isinstance(value, (dict, list)):
        return value
    if room <= 0:
        return CLIPPED
    if isinstance(value, dict):
        return {k: _clip(v, room - 1) for k, v in value.items()}
    return [_clip(v, room - 1) for v in value]
