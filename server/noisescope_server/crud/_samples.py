"""Sample ingest: a validated SampleBatch into ``sample`` rows and its ``sample_block`` sums.

A row stores the wire columns, its series as the run's number for the name (``_series``); the
per-sample estimates validation computed are summed into the blocks, never stored per row.

Stays thin on purpose (>= 50% of the raw driver's executemany rate end to end): rows go to the
driver in multi-row INSERTs of a few hundred rows (SQLite) or one ``unnest`` INSERT per chunk
(PostgreSQL), both insert-or-ignore on (run_id, seq) so a re-sent batch never duplicates.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import Connection, Engine

from noisescope import protocol
from noisescope_server.crud import _sql
from noisescope_server.crud._blocks import recompute_blocks
from noisescope_server.crud._compact import reopen_chunks
from noisescope_server.crud._runs import require_run
from noisescope_server.crud._series import series_ids
from noisescope_server.db import write_transaction
from noisescope_server.models import BLOCK_SIZE, SAMPLE_COLUMNS, SERIES_COLUMN
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
        # a late sample of a compacted run: the chunks around it become rows again first
        reopen_chunks(conn, run.id, batch.columns["seq"])
        numbers = series_ids(conn, run.id, _names(batch))
        inserted = insert_samples(conn, run.id, batch, numbers)
        if inserted:
            deltas = block_deltas(batch, numbers) if inserted == batch.n else None
            if deltas is not None:  # every row was new: add the batch's own sums
                _sql.add_block_deltas(conn, run.id, deltas)
            else:  # some rows were already stored: recompute the touched blocks
                refresh_blocks(conn, run.id, batch.columns["seq"])
        return inserted


def _as_float(col: Iterable[Any]) -> list[float | None]:
    return [None if v is None else float(v) for v in col]


def _names(batch: SampleBatch) -> list[str]:
    """The batch's series names, each once (validation found whether it holds one)."""
    names: list[str] = batch.columns["series"]
    if "series" in batch.uniform_columns:
        return names[:1]
    return list(dict.fromkeys(names))


def _series_column(batch: SampleBatch, numbers: dict[str, int]) -> list[int]:
    """The batch's series as the numbers they are stored under (``models.SERIES_COLUMN``)."""
    names: list[str] = batch.columns["series"]
    if "series" in batch.uniform_columns:
        return [numbers[names[0]]] * batch.n
    return [numbers[name] for name in names]


def insert_samples(
    conn: Connection, run_id: int, batch: SampleBatch, numbers: dict[str, int]
) -> int:
    """Insert-or-ignore the batch's rows through the driver's cursor, each series as its
    number in ``numbers`` (``_series.series_ids``); rows inserted."""
    if conn.dialect.name == "sqlite":
        return _insert_samples_sqlite(conn, run_id, batch, numbers)
    cols = batch.columns
    arrays: dict[str, list[Any]] = {
        "seq": cols["seq"],
        "step": cols["step"],
        SERIES_COLUMN: _series_column(batch, numbers),
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


def _insert_samples_sqlite(
    conn: Connection, run_id: int, batch: SampleBatch, numbers: dict[str, int]
) -> int:
    stored = {**batch.columns, SERIES_COLUMN: _series_column(batch, numbers)}
    columns = [stored[name] for name in SAMPLE_COLUMNS]
    width = len(_sql.SAMPLE_INSERT_COLUMNS)
    dbapi_connection = conn.connection.dbapi_connection
    per_insert = _sql.sqlite_rows_per_insert(dbapi_connection)
    inserted = 0
    cursor = dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        for start in range(0, batch.n, per_insert):
            rows = min(per_insert, batch.n - start)
            flat: list[Any] = [run_id] * (width * rows)  # run_id at 0, width, 2 * width, ...
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
    for first, last in _block_ranges(seqs):
        recompute_blocks(conn, run_id, first * BLOCK_SIZE, (last + 1) * BLOCK_SIZE)


def _nonnull(values: list[Any]) -> list[Any]:
    return [v for v in values if v is not None]


Aggregator = Callable[[int, int], Any]


def _aggregator(how: str, field: protocol.SampleField, batch: SampleBatch) -> Aggregator:
    """One ``sample_block`` column (``protocol.BLOCK_AGGREGATES``) over the rows ``[i, j)``.

    What validation found (no nulls, ascending, one value) skips the null filter, gives the
    extremes from the ends, or a sum of k equal values as k*x (one rounding, as math.fsum's).
    """
    name = field.name
    values = batch.columns.get(name)
    if values is None:  # a server-computed field
        values = batch.g_sq_est if name == "g_sq_est" else batch.trace_sigma_est
    as_stored: Callable[[Any], Any] = float if field.type is float else _same
    nulls = name in batch.null_columns

    def nonnull(i: int, j: int) -> list[Any]:
        return _nonnull(values[i:j]) if nulls else values[i:j]

    if name in batch.uniform_columns:  # one value, never null
        first = float(values[0])
        if how == "count":
            return lambda i, j: j - i
        if how == "sum":
            return lambda i, j: (j - i) * first
        return lambda i, j: as_stored(values[0])
    fsum = math.fsum
    if not nulls:  # the usual case: no filter, and a block is never empty
        if how == "count":
            return lambda i, j: j - i
        if how == "sum":
            return lambda i, j: fsum(values[i:j])
        if name in batch.ascending_columns:  # the extremes are the ends
            if how == "min":
                return lambda i, j: as_stored(values[i])
            return lambda i, j: as_stored(values[j - 1])
        pick = min if how == "min" else max
        return lambda i, j: as_stored(pick(values[i:j]))
    if how == "count":
        return lambda i, j: len(nonnull(i, j))
    if how == "sum":

        def total(i: int, j: int) -> float | None:
            found = nonnull(i, j)
            return fsum(found) if found else None

        return total
    end = 0 if how == "min" else -1
    choose = min if how == "min" else max
    ascending = name in batch.ascending_columns

    def extreme(i: int, j: int) -> Any:
        found = nonnull(i, j)
        if not found:
            return None
        return as_stored(found[end] if ascending else choose(found))

    return extreme


def _same(value: Any) -> Any:
    return value


def block_deltas(batch: SampleBatch, numbers: dict[str, int]) -> list[tuple[Any, ...]] | None:
    """Per-block sums of a batch whose seqs are ascending and share one series (stored as its
    number in ``numbers``).

    Only for a batch whose rows were all new (hence distinct seqs: ascending is then strictly
    increasing). That is what clients send (one series per batch is the common case; anything
    else falls back to recomputing from ``sample``). Slices and C-level ``math.fsum``/``min``/
    ``max`` keep this well under a microsecond per sample. Rows match ``_sql.BLOCK_COLUMNS``:
    each column is its aggregate of the field table (``protocol.BLOCK_AGGREGATES``).
    """
    cols = batch.columns
    seq, series, n = cols["seq"], cols["series"], batch.n
    if n == 0 or "seq" not in batch.ascending_columns or "series" not in batch.uniform_columns:
        return None
    fields = protocol.FIELDS_BY_NAME
    columns = [_aggregator(how, fields[name], batch) for _, how, name in protocol.BLOCK_AGGREGATES]
    number = numbers[series[0]]
    out: list[tuple[Any, ...]] = []
    i = 0
    while i < n:
        block = seq[i] // BLOCK_SIZE
        j = bisect.bisect_left(seq, (block + 1) * BLOCK_SIZE, i)
        out.append((number, block, *[column(i, j) for column in columns]))
        i = j
    return out
