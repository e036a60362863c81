"""Sample ingest: a validated SampleBatch into ``sample`` rows and its ``sample_block`` sums.

Stays thin on purpose (>= 50% of the raw driver's executemany rate end to end): rows go to the
driver in multi-row INSERTs of a few hundred rows (SQLite) or one ``unnest`` INSERT per chunk
(PostgreSQL), both insert-or-ignore on (run_id, seq) so a re-sent batch never duplicates.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, Engine

from noisescope_server.crud import _sql
from noisescope_server.crud._runs import require_run
from noisescope_server.db import write_transaction
from noisescope_server.models import BLOCK_SIZE, SAMPLE_COLUMNS
from noisescope_server.utc import utcnow
from noisescope_server.validate import FLOAT_COLUMNS, SampleBatch


def ingest_samples(
    engine: Engine, run_uid: str, batch: SampleBatch, *, project_scope: int | None = None
) -> int:
    """Insert-or-ignore a validated batch into a run; returns how many rows were new."""
    with write_transaction(engine) as conn:
        run = require_run(conn, run_uid, project_scope)
        # any write proves the run's process alive, a re-sent or empty batch too
        conn.execute(_sql.TOUCH_RUN, {"run_id": run.id, "now": utcnow()})
        if batch.n == 0:
            return 0
        inserted = insert_samples(conn, run.id, batch)
        if inserted:
            deltas = block_deltas(batch) if inserted == batch.n else None
            if deltas is not None:  # every row was new: add the batch's own sums
                add_block_deltas(conn, run.id, deltas)
            else:  # some rows were already stored: recompute the touched blocks
                refresh_blocks(conn, run.id, batch.columns["seq"])
        return inserted


def _as_float(col: Iterable[Any]) -> list[float | None]:
    return [None if v is None else float(v) for v in col]


def insert_samples(conn: Connection, run_id: int, batch: SampleBatch) -> int:
    """Insert-or-ignore the batch's rows through the driver's cursor; rows inserted."""
    if conn.dialect.name == "sqlite":
        return _insert_samples_sqlite(conn, run_id, batch)
    cols = batch.columns
    arrays: dict[str, list[Any]] = {
        "seq": cols["seq"],
        "step": cols["step"],
        "series": cols["series"],
        "g_sq_est": batch.g_sq_est,
        "trace_sigma_est": batch.trace_sigma_est,
    }
    for name in FLOAT_COLUMNS:
        arrays[name] = _as_float(cols[name])  # psycopg needs one element type per array
    inserted = 0
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        for start in range(0, batch.n, _sql.PG_CHUNK_ROWS):
            stop = min(start + _sql.PG_CHUNK_ROWS, batch.n)
            params = {name: values[start:stop] for name, values in arrays.items()}
            params["run_id"] = [run_id] * (stop - start)
            cursor.execute(_sql.PG_SAMPLE_INSERT, params)
            inserted += max(cursor.rowcount, 0)
    finally:
        cursor.close()
    return inserted


def _insert_samples_sqlite(conn: Connection, run_id: int, batch: SampleBatch) -> int:
    stored = {**batch.columns, "g_sq_est": batch.g_sq_est, "trace_sigma_est": batch.trace_sigma_est}
    columns = [stored[name] for name in SAMPLE_COLUMNS]
    width = len(_sql.SAMPLE_INSERT_COLUMNS)
    dbapi_connection = conn.connection.dbapi_connection
    per_insert = _sql.sqlite_rows_per_insert(dbapi_connection)
    inserted = 0
    cursor = dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        for start in range(0, batch.n, per_insert):
            rows = min(per_insert, batch.n - start)
            flat: list[Any] = [run_id] * (width * rows)  # run_id at 0, 14, 28, ...
            for offset, values in enumerate(columns, start=1):
                flat[offset::width] = values[start : start + rows]
            cursor.execute(_sql.sqlite_sample_insert(rows), flat)
            inserted += max(cursor.rowcount, 0)
    finally:
        cursor.close()
    return inserted


# --- sample_block maintenance ------------------------------------------------------------------


def _block_ranges(seqs: Iterable[int]) -> list[tuple[int, int]]:
    """Contiguous [first, last] block-index ranges touched by these sequence numbers."""
    blocks = sorted({s // BLOCK_SIZE for s in seqs})
    ranges: list[tuple[int, int]] = []
    for b in blocks:
        if ranges and b == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], b)
        else:
            ranges.append((b, b))
    return ranges


def refresh_blocks(conn: Connection, run_id: int, seqs: Iterable[int]) -> None:
    """Recompute the touched blocks from ``sample`` (exact and idempotent; see SampleBlock)."""
    stmt = _sql.BLOCK_UPSERT[conn.dialect.name]
    for first, last in _block_ranges(seqs):
        conn.execute(
            stmt,
            {"run_id": run_id, "seq_lo": first * BLOCK_SIZE, "seq_hi": (last + 1) * BLOCK_SIZE},
        )


def _nonnull(values: list[Any]) -> list[Any]:
    return [v for v in values if v is not None]


def block_deltas(batch: SampleBatch) -> list[tuple[Any, ...]] | None:
    """Per-block sums of a batch whose seqs are ascending and share one series.

    Only for a batch whose rows were all new (hence distinct seqs: ascending is then strictly
    increasing). That is what clients send (one series per batch is the common case; anything
    else falls back to recomputing from ``sample``). Slices and C-level ``math.fsum``/``min``/
    ``max`` keep this well under a microsecond per sample, and what validation found (no nulls,
    ascending, one value) skips the null filter or gives a block's extremes from its ends.
    Rows match ``_sql.BLOCK_COLUMNS``.
    """
    cols = batch.columns
    seq, series, n = cols["seq"], cols["series"], batch.n
    if n == 0 or "seq" not in batch.ascending_columns or "series" not in batch.uniform_columns:
        return None
    nulls, ascending = batch.null_columns, batch.ascending_columns

    def nonnull(name: str, i: int, j: int) -> list[Any]:
        values = cols[name][i:j]
        return _nonnull(values) if name in nulls else values

    def extremes(name: str, values: list[Any]) -> tuple[Any, Any]:
        if not values:
            return None, None
        if name in ascending:
            return values[0], values[-1]
        return min(values), max(values)

    def total(name: str, i: int, j: int) -> tuple[int, float | None]:
        """Count and exact sum of the non-null values; k equal values x sum to k*x (one
        rounding, as math.fsum's)."""
        if name in uniform:
            return j - i, (j - i) * float(cols[name][0])
        values = nonnull(name, i, j)
        return len(values), math.fsum(values) if values else None

    uniform = batch.uniform_columns
    b_big = cols["b_big"]
    b_big_max = float(b_big[0]) if "b_big" in uniform else None
    g_sq, trace_sigma = batch.g_sq_est, batch.trace_sigma_est
    out: list[tuple[Any, ...]] = []
    i = 0
    while i < n:
        block = seq[i] // BLOCK_SIZE
        j = bisect.bisect_left(seq, (block + 1) * BLOCK_SIZE, i)
        out.append(
            (
                series[0],
                block,
                j - i,
                math.fsum(g_sq[i:j]),
                math.fsum(trace_sigma[i:j]),
                *total("loss", i, j),
                *total("lr", i, j),
                *extremes("step", cols["step"][i:j]),
                *extremes("examples", nonnull("examples", i, j)),
                *extremes("time", nonnull("time", i, j)),
                float(max(b_big[i:j])) if b_big_max is None else b_big_max,
            )
        )
        i = j
    return out


def add_block_deltas(conn: Connection, run_id: int, deltas: list[tuple[Any, ...]]) -> None:
    """Add per-block sums (``block_deltas``) to the stored blocks, creating missing ones."""
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.executemany(_sql.BLOCK_ADD[conn.dialect.name], [(run_id, *d) for d in deltas])
    finally:
        cursor.close()
