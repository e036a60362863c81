"""Request bodies: size limits, gzip (with a decompression-bomb guard), orjson, and validation
errors turned into one readable ``detail`` string."""

from __future__ import annotations

import zlib
from typing import Any, TypeVar

import orjson
from fastapi import HTTPException, Request
from pydantic import BaseModel, ValidationError

__all__ = ["format_validation_error", "json_body", "openapi_body", "parse_model", "read_body"]

M = TypeVar("M", bound=BaseModel)


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The request body, decompressed, or 413/415/400 naming the limit or problem."""
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
    raw = b"".join(chunks)
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        return raw
    if encoding not in ("gzip", "x-gzip", "deflate"):
        raise HTTPException(415, f"unsupported Content-Encoding {encoding!r}; use gzip or none")
    return _decompress(raw, max_bytes, gzip=encoding != "deflate")


def _decompress(raw: bytes, max_bytes: int, *, gzip: bool) -> bytes:
    decomp = zlib.decompressobj(wbits=31 if gzip else 15)
    try:
        out = decomp.decompress(raw, max_bytes + 1)
    except zlib.error as exc:
        raise HTTPException(400, f"body is not valid gzip data: {exc}") from None
    if len(out) > max_bytes or decomp.unconsumed_tail:
        raise HTTPException(
            413, f"decompressed body exceeds the limit of {max_bytes} bytes: send smaller batches"
        )
    if not decomp.eof:
        raise HTTPException(400, "body is truncated gzip data")
    return out


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
