"""``sample_block`` rows computed in Python from samples' columns: each column the field
table's aggregate (``protocol.BLOCK_AGGREGATES``) over its samples, the derived fields' (the
per-sample estimates, which no table stores) from ``chunks.estimate_columns``, the one place
they are computed from stored columns. Sums are ``math.fsum`` (exactly rounded), as the
per-batch sums of ingest (``_samples.block_deltas``), so a block reads the same whichever path
wrote it."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, bindparam, delete, select

from noisescope import protocol
from noisescope_server.chunks import CHUNK_COLUMNS, estimate_columns
from noisescope_server.crud._sql import BLOCK_SET
from noisescope_server.models import BLOCK_SIZE, Sample, SampleBlock

#: A sample's stored columns but its series (what a chunk holds, and what a block sums).
ROW_COLUMNS = ("seq", *(c for c in CHUNK_COLUMNS if c != "seq"))


def with_estimates(columns: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """The columns and the derived ones (``protocol.DERIVED_COLUMNS``: the estimates)."""
    out = dict(columns)
    out["g_sq_est"], out["trace_sigma_est"] = estimate_columns(columns)
    return out


def block_rows(
    series_id: int, columns: dict[str, list[Any]], groups: Iterable[tuple[int, int, int]]
) -> list[tuple[Any, ...]]:
    """``_sql.BLOCK_COLUMNS`` rows, one per group ``(key, i, j)``: the samples ``[i, j)`` of
    ``columns`` (the derived ones included) summed as block ``key`` of series ``series_id``."""
    out: list[tuple[Any, ...]] = []
    for key, i, j in groups:
        values: list[Any] = []
        for _, how, name in protocol.BLOCK_AGGREGATES:
            present = [v for v in columns[name][i:j] if v is not None]
            if how == "count":
                values.append(len(present))
            elif not present:
                values.append(None)
            elif how == "sum":
                values.append(math.fsum(present))
            else:
                values.append(min(present) if how == "min" else max(present))
        out.append((series_id, key, *values))
    return out


def _seq_groups(seqs: list[int]) -> list[tuple[int, int, int]]:
    """Ascending seqs cut into their blocks: ``(seq // BLOCK_SIZE, i, j)``."""
    groups: list[tuple[int, int, int]] = []
    start = 0
    for i in range(1, len(seqs) + 1):
        if i == len(seqs) or seqs[i] // BLOCK_SIZE != seqs[start] // BLOCK_SIZE:
            groups.append((seqs[start] // BLOCK_SIZE, start, i))
            start = i
    return groups


_ROWS = (
    select(Sample.series_id, *(getattr(Sample, c) for c in ROW_COLUMNS))
    .where(
        Sample.run_id == bindparam("run_id"),
        Sample.seq >= bindparam("seq_lo"),
        Sample.seq < bindparam("seq_hi"),
    )
    .order_by(Sample.seq)
)
_SERIES_ROWS = _ROWS.where(Sample.series_id == bindparam("series_id"))


def recompute_blocks(
    conn: Connection, run_id: int, seq_lo: int, seq_hi: int, series_id: int | None = None
) -> None:
    """The seq blocks of a run over ``[seq_lo, seq_hi)`` (block-aligned) again from its
    ``sample`` rows (of series ``series_id`` only, unless None): exact and idempotent. A block
    without rows is left as it is (rows are never removed but by compaction, which deletes
    its blocks first)."""
    params = {"run_id": run_id, "seq_lo": seq_lo, "seq_hi": seq_hi, "series_id": series_id}
    found = conn.execute(_ROWS if series_id is None else _SERIES_ROWS, params).all()
    by_series: dict[int, list[Any]] = {}
    for row in found:
        by_series.setdefault(int(row[0]), []).append(row[1:])
    blocks: list[tuple[Any, ...]] = []
    for number, rows in sorted(by_series.items()):
        columns = {name: [r[k] for r in rows] for k, name in enumerate(ROW_COLUMNS)}
        blocks += block_rows(number, with_estimates(columns), _seq_groups(columns["seq"]))
    if blocks:
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            cursor.executemany(BLOCK_SET[conn.dialect.name], [(run_id, *b) for b in blocks])
        finally:
            cursor.close()


def delete_blocks(conn: Connection, run_id: int, series_id: int, lo: int, hi: int) -> None:
    """A series' blocks keyed ``lo`` to ``hi`` (inclusive) deleted."""
    conn.execute(
        delete(SampleBlock).where(
            SampleBlock.run_id == run_id,
            SampleBlock.series_id == series_id,
            SampleBlock.block >= lo,
            SampleBlock.block <= hi,
        )
    )
