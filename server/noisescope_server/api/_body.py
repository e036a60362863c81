"""Request bodies: size limits, a deadline, gzip (with a decompression-bomb guard), orjson, and
validation errors turned into one readable ``detail`` string.

uvicorn bounds neither how long a request body may take to arrive (``timeout_keep_alive``
only covers the idle time between requests, and every received byte resets it) nor anything
else a slow client does, so ``read_body`` gives the whole body one deadline, the setting
``read_timeout``.
"""

from __future__ import annotations

import asyncio
import zlib
from typing import Any, TypeVar

import orjson
from fastapi import HTTPException, Request
from pydantic import BaseModel, ValidationError

__all__ = ["format_validation_error", "json_body", "openapi_body", "parse_model", "read_body"]

M = TypeVar("M", bound=BaseModel)


async def read_body(request: Request, max_bytes: int, timeout: float | None = None) -> bytes:
    """The request body, decompressed, or 413/415/400 naming the limit or problem; 408 when it
    has not all arrived within ``timeout`` seconds (default: the app's ``read_timeout``).

    A client that goes away mid-body raises starlette's ``ClientDisconnect`` (logged at info
    level by the app's handler: nobody is left to answer)."""
    if timeout is None:
        timeout = request.app.state.settings.read_timeout
    try:
        async with asyncio.timeout(timeout):
            raw = await _receive(request, max_bytes)
    except TimeoutError:
        raise HTTPException(
            408,
            f"the request body did not arrive within {timeout:g} s (the server's read timeout); "
            "send it at once, or in smaller batches",
            {"Connection": "close"},
        ) from None
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        return raw
    if encoding not in ("gzip", "x-gzip", "deflate"):
        raise HTTPException(415, f"unsupported Content-Encoding {encoding!r}; use gzip or none")
    return _decompress(raw, max_bytes, gzip=encoding != "deflate")


async def _receive(request: Request, max_bytes: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise HTTPException(400, "Content-Length is not an integer") from None
        if size > max_bytes:
            raise HTTPException(
                413,
                f"request body is {size} bytes; the limit is {max_bytes} bytes: "
                "send smaller batches",
            )
    chunks: list[bytes] = []
    received = 0
    async for chunk in request.stream():
        received += len(chunk)
        if received > max_bytes:
            raise HTTPException(
                413, f"request body exceeds the limit of {max_bytes} bytes: send smaller batches"
            )
        chunks.append(chunk)
    return b"".join(chunks)


_GZIP_MAGIC = b"\x1f\x8b"


def _decompress(raw: bytes, max_bytes: int, *, gzip: bool) -> bytes:
    """Every member of a gzip body, concatenated (RFC 1952 allows several, and ``gzip -c a b``
    writes them), within ``max_bytes`` in all; anything after the last member is a 400."""
    name = "gzip" if gzip else "deflate"
    parts: list[bytes] = []
    total = 0
    rest = raw
    while True:
        decomp = zlib.decompressobj(wbits=31 if gzip else 15)
        try:
            out = decomp.decompress(rest, max_bytes - total + 1)
        except zlib.error as exc:
            raise HTTPException(400, f"body is not valid {name} data: {exc}") from None
        total += len(out)
        if total > max_bytes or decomp.unconsumed_tail:
            raise HTTPException(
                413,
                f"decompressed body exceeds the limit of {max_bytes} bytes: send smaller batches",
            )
        if not decomp.eof:
            raise HTTPException(400, f"body is truncated {name} data")
        parts.append(out)
        rest = decomp.unused_data
        if not rest:
            return b"".join(parts)
        if not (gzip and rest.startswith(_GZIP_MAGIC)):
            raise HTTPException(
                400,
                f"body has {len(rest)} bytes of trailing data after the {name} stream; "
                "send exactly one compressed body",
            )


def json_body(raw: bytes) -> Any:
    if not raw:
        raise HTTPException(400, "request body is empty; expected a JSON object")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise HTTPException(
            400, f"body is not valid JSON ({exc}); NaN and Infinity are not allowed"
        ) from None


def format_validation_error(exc: ValidationError | Any) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "; ".join(parts[:5]) + (f" (and {len(parts) - 5} more)" if len(parts) > 5 else "")


def parse_model(model: type[M], raw: bytes) -> M:
    data = json_body(raw)
    if not isinstance(data, dict):
        raise HTTPException(422, "body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise HTTPException(422, format_validation_error(exc)) from None


def _inline_refs(schema: Any, defs: dict[str, Any]) -> Any:
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return _inline_refs(defs[ref.rsplit("/", 1)[1]], defs)
        return {k: _inline_refs(v, defs) for k, v in schema.items() if k != "$defs"}
    if isinstance(schema, list):
        return [_inline_refs(v, defs) for v in schema]
    return schema


def openapi_body(model: type[BaseModel] | dict[str, Any]) -> dict[str, Any]:
    """``openapi_extra`` documenting a body that the route reads itself (orjson, limits)."""
    if isinstance(model, dict):
        schema = model
    else:
        raw = model.model_json_schema()
        schema = _inline_refs(raw, raw.get("$defs", {}))
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}
