"""The one request builder of the client (sender and ``noisescope sync``): JSON encoding and
compression of a body, under one size threshold and one gzip level.

Samples are encoded one column at a time (``encode_columns``), with ``_json.dumps`` (orjson
when installed).
"""

from __future__ import annotations

import gzip
import ipaddress
from typing import Any
from urllib.parse import urlsplit

from noisescope._json import dumps
from noisescope._transport import Request

#: Bodies at least this large are gzip-compressed (unless the server is on this machine).
GZIP_MIN_BYTES = 1024
#: zlib level 1 compresses sample bodies to ~35% against ~34% at level 5, at a fifth of the
#: CPU (``benchmarks/log_overhead.py``): the sender shares the training process's GIL.
GZIP_LEVEL = 1

Columns = dict[str, list[Any]]


def encode_columns(columns: Columns) -> bytes:
    """``{"columns": {...}}`` encoded one column at a time.

    The encoders run in C without releasing the GIL; one column (<= batch_max values) per
    call bounds how long the training thread can wait for the GIL to a fraction of a
    millisecond, instead of the whole batch's encoding time.
    """
    parts = [b'"' + name.encode() + b'":' + dumps(values) for name, values in columns.items()]
    return b'{"columns":{' + b",".join(parts) + b"}}"


def encode_payload(payload: dict[str, Any] | None) -> bytes:
    """A request body: samples column by column, anything else as one JSON value, None as
    an empty body."""
    if payload is None:
        return b""
    columns = payload.get("columns") if len(payload) == 1 else None
    if isinstance(columns, dict):
        return encode_columns(columns)
    return dumps(payload)


def is_loopback(url: str) -> bool:
    """Whether ``url`` names this machine (there, compressing costs more CPU than it saves)."""
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def build_request(
    method: str,
    path: str,
    payload: dict[str, Any] | None,
    *,
    compress: bool = True,
    gzip_min_bytes: int = GZIP_MIN_BYTES,
) -> Request:
    """The request for ``payload`` (None: an empty body), gzip-compressed when ``compress``
    and the body is at least ``gzip_min_bytes``."""
    body = encode_payload(payload)
    if payload is None:
        return Request(method, path, body, {})
    headers = {"Content-Type": "application/json"}
    if compress and len(body) >= gzip_min_bytes:
        body = gzip.compress(body, compresslevel=GZIP_LEVEL)
        headers["Content-Encoding"] = "gzip"
    return Request(method, path, body, headers)
