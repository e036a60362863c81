"""A compacted run's samples as compressed column chunks: the encoding (pure, no database).

A chunk holds up to ``CHUNK_ROWS`` consecutive samples of one (run, series), in seq order, as
one blob: every wire column but ``series`` (the chunk row names it once), each encoded for
what it usually holds, then the whole compressed with the standard library's ``zlib``:

- integers (``seq``, ``step``): deltas from the previous value (a constant stride compresses
  to almost nothing), or the values themselves where a delta would not fit 64 bits;
- floats: where they are null (a one-byte mask, absent when none is), then the non-null
  values' IEEE bits each XORed with the previous one's (a repeated value, such as a batch size
  or a constant lr, is all zero bits; neighbouring losses and times share their sign,
  exponent and leading mantissa bits), then byte-planed (every value's first byte, then every
  second byte, ...) so that those shared bytes sit side by side for the compressor.

Lossless: every value decodes to the same Python value (ints exactly, floats bit for bit, -0.0
and null included). The per-sample estimates are not stored: readers derive them
(``queries._samples``) with the same ``estimators`` expressions ingest uses, so they read
back the same floats.
"""

from __future__ import annotations

import struct
import zlib
from array import array
from itertools import accumulate, chain, groupby
from operator import add, xor
from typing import Any, Final

from noisescope import protocol
from noisescope.estimators import two_batch_estimate_columns

#: The columns of a chunk, in blob order: the wire columns except ``series``.
CHUNK_COLUMNS: Final = tuple(c for c in protocol.SAMPLE_COLUMNS if c != "series")
INT_COLUMNS: Final = frozenset(f.name for f in protocol.SAMPLE_FIELDS if f.type is int)
#: Samples per chunk at most: big enough for the compressor to find the repeats, small enough
#: that a late sample re-opens (``crud.reopen_chunks``) only a few thousand samples.
CHUNK_ROWS: Final = 4096
#: Blob format version (the first byte), so a later encoding can be told apart.
VERSION: Final = 1
_INT64 = (-(2**63), 2**63 - 1)
# per column: kind byte, then the section's length; kinds below
_HEAD = struct.Struct("<BI")
_DELTAS, _VALUES, _FLOATS, _FLOATS_MASKED, _ALL_NULL = range(5)


def encode_chunk(columns: dict[str, list[Any]]) -> bytes:
    """One chunk's blob from its columns (each a list of the chunk's ``n`` values, seq order).

    Each column's section is named, so a chunk written before a sample field was added reads
    that field as null (as a migration adding a nullable column leaves old rows)."""
    n = len(columns["seq"])
    parts = [struct.pack("<BI", VERSION, n)]
    for name in CHUNK_COLUMNS:
        values = columns[name]
        if len(values) != n:
            raise ValueError(f"column {name!r} has {len(values)} values, seq has {n}")
        kind, body = _encode_ints(values) if name in INT_COLUMNS else _encode_floats(values)
        label = name.encode()
        parts.append(struct.pack("<B", len(label)) + label)
        parts.append(_HEAD.pack(kind, len(body)))
        parts.append(body)
    return zlib.compress(b"".join(parts), 6)


def decode_chunk(blob: bytes) -> dict[str, list[Any]]:
    """A chunk's columns from its blob (``encode_chunk``'s inverse)."""
    raw = zlib.decompress(blob)
    version, n = struct.unpack_from("<BI", raw, 0)
    if version != VERSION:
        raise ValueError(f"sample chunk format {version} is not {VERSION}: upgrade the server")
    at = struct.calcsize("<BI")
    out: dict[str, list[Any]] = {}
    while at < len(raw):
        size = raw[at]
        name = raw[at + 1 : at + 1 + size].decode()
        at += 1 + size
        kind, size = _HEAD.unpack_from(raw, at)
        at += _HEAD.size
        body = raw[at : at + size]
        at += size
        if name in INT_COLUMNS:
            out[name] = _decode_ints(kind, body)
        else:
            out[name] = _decode_floats(kind, body, n)
    return {name: out.get(name) or [None] * n for name in CHUNK_COLUMNS}


def estimate_columns(columns: dict[str, list[Any]]) -> tuple[list[float], list[float]]:
    """The per-sample |𝒢|^2 and 𝒮 that rows and chunks do not store, from the stored columns:
    ``estimators.two_batch_estimate_columns`` over each stretch of samples at one pair of
    batch sizes (a run's are usually all one pair), the expressions of
    ``two_batch_estimates`` element for element, so the same floats at about half the cost:
    the run and task lists derive every live run's window this way."""
    g_small_sq, g_big_sq = columns["g_small_sq"], columns["g_big_sq"]
    g_sq: list[float] = []
    trace_sigma: list[float] = []
    pairs = zip(columns["b_small"], columns["b_big"], strict=True)
    for (b_small, b_big), stretch in groupby(pairs):
        lo = len(g_sq)
        hi = lo + len(list(stretch))
        g, s = two_batch_estimate_columns(b_small, b_big, g_small_sq[lo:hi], g_big_sq[lo:hi])
        g_sq += g
        trace_sigma += s
    return g_sq, trace_sigma


# --- integers ----------------------------------------------------------------------------------


def _encode_ints(values: list[int]) -> tuple[int, bytes]:
    deltas = list(map(int.__sub__, values, chain((0,), values)))
    if deltas and _INT64[0] <= min(deltas) and max(deltas) <= _INT64[1]:
        return _DELTAS, _planes(array("q", deltas).tobytes())
    return _VALUES, _planes(array("q", values).tobytes())


def _decode_ints(kind: int, body: bytes) -> list[int]:
    values = array("q")
    values.frombytes(_unplanes(body))
    return list(accumulate(values, add)) if kind == _DELTAS else values.tolist()


# --- floats ------------------------------------------------------------------------------------


def _encode_floats(values: list[float | None]) -> tuple[int, bytes]:
    present = [v for v in values if v is not None]
    if not present and values:
        return _ALL_NULL, b""
    bits = array("Q")
    bits.frombytes(array("d", present).tobytes())
    xored = array("Q", map(xor, bits, chain((0,), bits))).tobytes()
    if len(present) == len(values):
        return _FLOATS, _planes(xored)
    mask = bytes(v is not None for v in values)
    return _FLOATS_MASKED, struct.pack("<I", len(mask)) + mask + _planes(xored)


def _decode_floats(kind: int, body: bytes, n: int) -> list[Any]:
    if kind == _ALL_NULL:
        return [None] * n
    mask = b""
    if kind == _FLOATS_MASKED:
        (size,) = struct.unpack_from("<I", body, 0)
        mask, body = body[4 : 4 + size], body[4 + size :]
    xored = array("Q")
    xored.frombytes(_unplanes(body))
    floats = array("d")
    floats.frombytes(array("Q", accumulate(xored, xor)).tobytes())
    present = floats.tolist()
    if kind == _FLOATS:
        return present
    it = iter(present)
    return [next(it) if m else None for m in mask]


# --- byte planes -------------------------------------------------------------------------------


def _planes(raw: bytes) -> bytes:
    """Every 8-byte value's byte 0, then every byte 1, ... (slicing runs in C)."""
    return b"".join(raw[i::8] for i in range(8))


def _unplanes(planed: bytes) -> bytes:
    n = len(planed) // 8
    out = bytearray(len(planed))
    for i in range(8):
        out[i::8] = planed[i * n : (i + 1) * n]
    return bytes(out)
