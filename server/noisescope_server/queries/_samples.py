"""THE read seam of a run's samples: its ``sample`` rows and its compacted chunks
(``sample_chunk``, ``noisescope_server.chunks``) as one sequence in seq order.

Every read of individual samples goes through here; the sums of ``sample_block`` are kept
through compaction and read directly. A live run has no chunks, and its reads run one
statement; a compacted run's chunks are decoded here. Neither form stores the per-sample
estimates (``protocol.DERIVED_COLUMNS``: ``g_sq_est``, ``trace_sigma_est``) nor the series'
name: the estimates are derived here with the ``estimators`` expressions ingest validates and
sums (``chunks.estimate_columns``), the name read from the run's ``series`` table, so a sample
reads the same whichever form it is in.

Rows are read before chunks, and a seq met twice is read once: a compaction that commits
between the two statements (moving rows into chunks) is then neither lost nor doubled.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Connection, bindparam, select

from noisescope import protocol
from noisescope.estimators import two_batch_expressions
from noisescope_server.chunks import decode_chunk, estimate_columns
from noisescope_server.models import SERIES_COLUMN, WHOLE_MODEL, Sample, SampleChunk, Series
from noisescope_server.queries._common import fetch_tuples

#: The columns readers may ask for (``protocol.READ_COLUMNS``) that no table stores.
DERIVED = protocol.DERIVED_COLUMNS
#: What the derived columns are computed from (``chunks.estimate_columns``' arguments).
_ESTIMATE_INPUTS = ("b_small", "b_big", "g_small_sq", "g_big_sq")


#: The derived columns as SQL over ``sample``: the estimators' one formula
#: (``estimators.two_batch_expressions``) applied to the columns.
ESTIMATE_SQL: dict[str, Any] = dict(
    zip(
        DERIVED,
        two_batch_expressions(Sample.b_small, Sample.b_big, Sample.g_small_sq, Sample.g_big_sq),
        strict=True,
    )
)


def summed_in_sql(conn: Connection, run_ids: Iterable[int]) -> set[int]:
    """Which of these runs SQL can sum sample by sample (``ESTIMATE_SQL``): on SQLite, whose
    IEEE doubles give the floats Python gives, the runs without chunks; on PostgreSQL none (it
    raises on a float overflow or underflow that Python takes as inf or 0, and a sample's
    sizes may be as small as a float gets), so their short runs are summed in Python."""
    ids = list(run_ids)
    if conn.dialect.name != "sqlite" or not ids:
        return set()
    stmt = select(SampleChunk.run_id).where(SampleChunk.run_id.in_(ids)).distinct()
    return set(ids) - {int(r) for (r,) in fetch_tuples(conn, stmt)}


def sample_rows(
    conn: Connection,
    run_id: int,
    columns: Sequence[str],
    *,
    series: str | None = None,
    seq_lo: int | None = None,
    seq_hi: int | None = None,
    limit: int | None = None,
) -> list[tuple[Any, ...]]:
    """A run's samples with seq in ``[seq_lo, seq_hi)`` (of ``series`` only, unless None) as
    tuples of ``columns`` (``protocol.READ_COLUMNS``), in seq order; with ``limit``, the first
    ``limit`` of them."""
    number = None if series is None else series_number(conn, run_id, series)
    if number == _ABSENT:
        return []
    lo = _LOWEST if seq_lo is None else seq_lo
    hi = _HIGHEST if seq_hi is None else seq_hi - 1  # inclusive from here on
    params = {"run_id": run_id, "series": number, "lo": lo, "hi": hi}
    fetch = _stored(tuple(columns))
    rows_stmt, index_stmt = _range_statements(fetch, series is not None)
    rows = fetch_tuples(conn, rows_stmt, {**params, "limit": _HIGHEST if limit is None else limit})
    chunks = fetch_tuples(conn, index_stmt, params)
    names = _names(conn, run_id) if "series" in columns else {}
    rows = _shaped(rows, fetch, columns, names)
    if not chunks:
        return [row[1:] for row in rows]
    found: list[tuple[Any, ...]] = []
    for series_id, seq_first in chunks:
        # with a limit, stop once ``limit`` samples come before anything this chunk holds
        if limit is not None and _nth_seq(rows, found, limit) < seq_first:
            break
        data = _chunk_data(conn, run_id, series_id, seq_first)
        found += [r for r in _chunk_rows(series_id, data, columns, names) if lo <= r[0] <= hi]
    merged = _merge(rows, found)
    return merged if limit is None else merged[:limit]


def _nth_seq(rows: list[Any], found: list[Any], n: int) -> float:
    """The n-th smallest seq among rows and found samples (infinity when fewer)."""
    seqs = sorted({r[0] for r in rows} | {r[0] for r in found})
    return seqs[n - 1] if len(seqs) >= n else float("inf")


def _chunk_data(conn: Connection, run_id: int, series_id: int, seq_first: int) -> bytes | None:
    """One chunk's blob; None when a late sample reopened it since the index was read."""
    data = conn.execute(
        _CHUNK_DATA, {"run_id": run_id, "series": series_id, "seq_first": seq_first}
    ).scalar()
    return None if data is None else bytes(data)


def last_rows(
    conn: Connection,
    run_id: int,
    columns: Sequence[str],
    count: int,
    *,
    series: str | None = None,
    not_null: str | None = None,
) -> list[tuple[Any, ...]]:
    """A run's last ``count`` samples (of ``series`` only, unless None; with a value in
    ``not_null``, if named) as tuples of ``columns``, oldest first."""
    number = None if series is None else series_number(conn, run_id, series)
    if number == _ABSENT:
        return []
    fetch = _stored(tuple(columns))
    rows_stmt, index_stmt = _last_statements(fetch, series is not None, not_null)
    params = {"run_id": run_id, "series": number}
    rows = fetch_tuples(conn, rows_stmt, {**params, "count": count})
    chunks = fetch_tuples(conn, index_stmt, params)
    names = _names(conn, run_id) if "series" in columns else {}
    rows = _shaped(rows, fetch, columns, names)
    if not chunks:
        rows.reverse()
        return [row[1:] for row in rows]
    at = columns.index(not_null) + 1 if not_null is not None else None
    found: list[tuple[Any, ...]] = []
    for series_id, seq_first, seq_last in chunks:
        # chunks of one series never overlap; of several they may: stop only once ``count``
        # samples are newer than anything this chunk (and every later one) holds
        if len(found) >= count and sorted(r[0] for r in found)[-count] > seq_last:
            break
        data = _chunk_data(conn, run_id, series_id, seq_first)
        found += [
            r
            for r in _chunk_rows(series_id, data, columns, names)
            if at is None or r[at] is not None
        ]
    merged = _merge(rows, found)
    return merged[-count:] if count > 0 else []


# Statements built once per shape, with bound parameters: a run list reads every run's last
# samples, and building a statement costs more than running it.
_LOWEST, _HIGHEST = -(2**63), 2**63 - 1


def _where(table: Any, with_series: bool) -> list[Any]:
    where = [table.run_id == bindparam("run_id")]
    if with_series:
        where.append(table.series_id == bindparam("series"))
    return where


#: ``series_number`` of a name the run does not have.
_ABSENT = -1
_NUMBER = select(Series.id).where(
    Series.run_id == bindparam("run_id"), Series.name == bindparam("name")
)
_NAMES = select(Series.id, Series.name).where(Series.run_id == bindparam("run_id"))


def series_number(conn: Connection, run_id: int, name: str) -> int:
    """The number a run's series ``name`` is stored under; ``_ABSENT`` when it has none."""
    if name == "":
        return WHOLE_MODEL  # every run's, without a lookup
    found = conn.execute(_NUMBER, {"run_id": run_id, "name": name}).scalar()
    return _ABSENT if found is None else int(found)


def _names(conn: Connection, run_id: int) -> dict[int, str]:
    """A run's series names by number."""
    return {int(i): str(n) for i, n in fetch_tuples(conn, _NAMES, {"run_id": run_id})}


@functools.lru_cache(maxsize=64)
def _stored(columns: tuple[str, ...]) -> tuple[str, ...]:
    """The stored columns that ``columns`` are read from: each stored one as it is (the series
    as its number), the derived ones from the estimators' inputs."""
    out = [SERIES_COLUMN if c == "series" else c for c in columns if c not in DERIVED]
    if any(c in DERIVED for c in columns):
        out += [c for c in _ESTIMATE_INPUTS if c not in out]
    return tuple(out)


def _shaped(
    found: list[tuple[Any, ...]],
    fetch: tuple[str, ...],
    columns: Sequence[str],
    names: dict[int, str],
) -> list[tuple[Any, ...]]:
    """``(seq, *fetch)`` tuples as ``(seq, *columns)``: the series' names, the derived
    columns computed (``chunks.estimate_columns``)."""
    if fetch == tuple(columns) or not found:
        return found
    values = {name: [r[k] for r in found] for k, name in enumerate(("seq", *fetch))}
    return _columns_as_rows(values, columns, names)


def _columns_as_rows(
    values: dict[str, list[Any]], columns: Sequence[str], names: dict[int, str]
) -> list[tuple[Any, ...]]:
    """Columns of stored values (the series as its number) as ``(seq, *columns)`` tuples."""
    if any(c in DERIVED for c in columns):
        values["g_sq_est"], values["trace_sigma_est"] = estimate_columns(values)
    if "series" in columns:
        values["series"] = [names[i] for i in values[SERIES_COLUMN]]
    return list(zip(values["seq"], *(values[c] for c in columns), strict=True))


@functools.lru_cache(maxsize=64)
def _range_statements(columns: tuple[str, ...], with_series: bool) -> tuple[Any, Any]:
    """The rows of a seq range ``[lo, hi]`` (``sample_rows``), and the chunks overlapping it."""
    rows = (
        select(Sample.seq, *(getattr(Sample, c) for c in columns))
        .where(
            *_where(Sample, with_series),
            Sample.seq >= bindparam("lo"),
            Sample.seq <= bindparam("hi"),
        )
        .order_by(Sample.seq)
        .limit(bindparam("limit"))
    )
    index = (
        select(SampleChunk.series_id, SampleChunk.seq_first)
        .where(
            *_where(SampleChunk, with_series),
            SampleChunk.seq_last >= bindparam("lo"),
            SampleChunk.seq_first <= bindparam("hi"),
        )
        .order_by(SampleChunk.seq_first)
    )
    return rows, index


@functools.lru_cache(maxsize=64)
def _last_statements(
    columns: tuple[str, ...], with_series: bool, not_null: str | None
) -> tuple[Any, Any]:
    """The last rows (``last_rows``), and the chunks newest first."""
    where = _where(Sample, with_series)
    if not_null is not None:
        where.append(getattr(Sample, not_null).is_not(None))
    rows = (
        select(Sample.seq, *(getattr(Sample, c) for c in columns))
        .where(*where)
        .order_by(Sample.seq.desc())
        .limit(bindparam("count"))
    )
    index = (
        select(SampleChunk.series_id, SampleChunk.seq_first, SampleChunk.seq_last)
        .where(*_where(SampleChunk, with_series))
        .order_by(SampleChunk.seq_last.desc())
    )
    return rows, index


_CHUNK_DATA = select(SampleChunk.data).where(
    SampleChunk.run_id == bindparam("run_id"),
    SampleChunk.series_id == bindparam("series"),
    SampleChunk.seq_first == bindparam("seq_first"),
)


def _chunk_rows(
    series_id: int, data: bytes | None, columns: Sequence[str], names: dict[int, str]
) -> list[tuple[Any, ...]]:
    """A chunk's samples as (seq, *columns) tuples, as rows read (``_columns_as_rows``)."""
    if data is None:
        return []
    cols: dict[str, Any] = decode_chunk(data)
    cols[SERIES_COLUMN] = [series_id] * len(cols["seq"])
    return _columns_as_rows(cols, columns, names)


def _merge(rows: list[Any], decoded: list[Any]) -> list[tuple[Any, ...]]:
    """Rows and decoded samples, both ``(seq, *columns)``, as ``columns`` in seq order, each
    seq once."""
    both = sorted([*rows, *decoded], key=lambda r: r[0])
    out: list[tuple[Any, ...]] = []
    last = None
    for row in both:
        if row[0] != last:
            out.append(tuple(row[1:]))
            last = row[0]
    return out
