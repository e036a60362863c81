"""Compaction: a finished (or long quiet) run's ``sample`` rows into compressed column chunks
(``sample_chunk``, encoded by ``noisescope_server.chunks``), and back for a late sample.

Each step is one transaction that inserts one chunk and deletes exactly the rows it holds, so a
sample is always either a row or in one chunk, never both and never neither: a process killed
in the middle of a compaction leaves a partly compacted run that reads the same, and the next
compaction carries on.

``sample_block`` keeps exact sums throughout. The whole-model series keeps its blocks as they
are (64 consecutive seqs: the current window reads them newest first). A per-layer series'
blocks are sparse (a seq block of a run logging 48 layers holds about one sample of each), so
its compacted samples are summed instead in blocks of 64 consecutive samples of the series,
keyed ``-(first seq) - 1`` (negative: never a seq block's key); its seq blocks then sum only
the samples that are rows. Reopening a chunk reverses that.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    and_,
    bindparam,
    delete,
    exists,
    func,
    insert,
    or_,
    select,
)

from noisescope_server.chunks import CHUNK_ROWS, decode_chunk, encode_chunk
from noisescope_server.crud._blocks import (
    ROW_COLUMNS,
    block_rows,
    delete_blocks,
    recompute_blocks,
    with_estimates,
)
from noisescope_server.crud._digests import store_digests
from noisescope_server.crud._sql import LOCK_RUN_FOR_COMPACTION, add_block_deltas, dialect_insert
from noisescope_server.db import write_transaction
from noisescope_server.models import (
    BLOCK_SIZE,
    WHOLE_MODEL,
    Run,
    Sample,
    SampleBlock,
    SampleChunk,
)
from noisescope_server.settings import COMPACT_FINISHED_AFTER, COMPACT_QUIET_AFTER
from noisescope_server.utc import utcnow


@dataclass(frozen=True)
class Compacted:
    """What one ``compact_run`` did: samples moved into chunks, chunks written."""

    samples: int
    chunks: int


def compact_run(
    engine: Engine,
    run_id: int,
    *,
    chunk_rows: int = CHUNK_ROWS,
    stop: Callable[[], bool] | None = None,
) -> Compacted:
    """Move every ``sample`` row of a run into chunks of at most ``chunk_rows`` samples per
    series, one chunk per transaction (see the module's docstring); ``stop()`` true ends it
    between two chunks (the rest stays rows until the next compaction)."""
    with engine.connect() as conn:
        numbers = [
            int(s)
            for (s,) in conn.execute(
                select(SampleBlock.series_id).where(SampleBlock.run_id == run_id).distinct()
            )
        ]
    samples = chunks = 0
    for series_id in numbers:
        while stop is None or not stop():
            moved = _compact_step(engine, run_id, series_id, chunk_rows)
            if moved == 0:
                break
            samples += moved
            chunks += 1
    if numbers and (stop is None or not stop()):
        store_digests(engine, [run_id])
    return Compacted(samples, chunks)


def _compact_step(engine: Engine, run_id: int, series_id: int, chunk_rows: int) -> int:
    """One chunk: the first ``chunk_rows`` rows of (run, series) in, the same rows out."""
    with write_transaction(engine) as conn:
        lock = LOCK_RUN_FOR_COMPACTION[conn.dialect.name]
        if conn.execute(lock, {"run_id": run_id}).first() is None:
            return 0  # deleted meanwhile
        where = [Sample.run_id == run_id, Sample.series_id == series_id]
        start = conn.execute(select(func.min(Sample.seq)).where(*where)).scalar()
        if start is None:
            return 0
        # a chunk never spans another chunk of its series (one left after a late sample
        # reopened an earlier one): chunks of a series hold disjoint seq ranges
        bound = conn.execute(
            select(func.min(SampleChunk.seq_first)).where(
                SampleChunk.run_id == run_id,
                SampleChunk.series_id == series_id,
                SampleChunk.seq_first > start,
            )
        ).scalar()
        if bound is not None:
            where.append(Sample.seq < bound)
        rows = conn.execute(
            select(*(getattr(Sample, c) for c in ROW_COLUMNS))
            .where(*where)
            .order_by(Sample.seq)
            .limit(chunk_rows)
        ).all()
        columns = {name: [r[i] for r in rows] for i, name in enumerate(ROW_COLUMNS)}
        first, last = int(rows[0][0]), int(rows[-1][0])
        conn.execute(
            dialect_insert(conn.dialect.name)(SampleChunk).values(
                run_id=run_id,
                series_id=series_id,
                seq_first=first,
                seq_last=last,
                n=len(rows),
                data=encode_chunk(columns),
            )
        )
        conn.execute(
            delete(Sample).where(
                Sample.run_id == run_id,
                Sample.series_id == series_id,
                Sample.seq >= first,
                Sample.seq <= last,
            )
        )
        if series_id != WHOLE_MODEL:
            _refresh_series_blocks(conn, run_id, series_id, first, last)
            add_block_deltas(conn, run_id, _sample_blocks(series_id, columns))
        return len(rows)


def _refresh_series_blocks(
    conn: Connection, run_id: int, series_id: int, first: int, last: int
) -> None:
    """A per-layer series' seq blocks over seqs [first, last] again from its rows alone."""
    lo, hi = first // BLOCK_SIZE, last // BLOCK_SIZE
    delete_blocks(conn, run_id, series_id, lo, hi)
    recompute_blocks(conn, run_id, lo * BLOCK_SIZE, (hi + 1) * BLOCK_SIZE, series_id)


def _sample_blocks(series_id: int, columns: dict[str, list[Any]]) -> list[tuple[Any, ...]]:
    """A chunk's samples summed 64 at a time (``_sql.BLOCK_COLUMNS`` rows, keyed
    ``-(first seq) - 1``): each column its aggregate of the field table."""
    seqs = columns["seq"]
    groups = [(-seqs[i] - 1, i, i + BLOCK_SIZE) for i in range(0, len(seqs), BLOCK_SIZE)]
    return block_rows(series_id, with_estimates(columns), groups)


#: The chunks of a run overlapping seqs [lo, hi), built once (it runs on every ingest).
_OVERLAPPING = select(SampleChunk.series_id, SampleChunk.seq_first, SampleChunk.data).where(
    SampleChunk.run_id == bindparam("run_id"),
    SampleChunk.seq_first < bindparam("hi"),
    SampleChunk.seq_last >= bindparam("lo"),
)


def reopen_chunks(conn: Connection, run_id: int, seqs: list[int]) -> int:
    """Turn back into rows every chunk of the run that overlaps the blocks these seqs fall in
    (in the caller's ingest transaction), so that insert-or-ignore and the block refresh see
    those samples as rows; returns the samples reopened. A run without chunks costs one
    indexed lookup."""
    lo = min(seqs) // BLOCK_SIZE * BLOCK_SIZE
    hi = (max(seqs) // BLOCK_SIZE + 1) * BLOCK_SIZE
    found = conn.execute(_OVERLAPPING, {"run_id": run_id, "lo": lo, "hi": hi}).all()
    if not found:
        return 0
    reopened = 0
    for series_id, seq_first, data in found:
        cols: dict[str, Any] = decode_chunk(bytes(data))
        n = len(cols["seq"])
        cols["run_id"], cols["series_id"] = [run_id] * n, [series_id] * n
        rows = [dict(zip(cols, values, strict=True)) for values in zip(*cols.values(), strict=True)]
        conn.execute(
            delete(SampleChunk).where(
                SampleChunk.run_id == run_id,
                SampleChunk.series_id == series_id,
                SampleChunk.seq_first == seq_first,
            )
        )
        conn.execute(insert(Sample), rows)
        if series_id != WHOLE_MODEL:  # rows again: seq blocks sum them, not sample blocks
            first, last = int(seq_first), max(cols["seq"])
            delete_blocks(conn, run_id, series_id, -last - 1, -first - 1)
            _refresh_series_blocks(conn, run_id, series_id, first, last)
        reopened += len(rows)
    return reopened


def runs_to_compact(
    engine: Engine,
    *,
    finished_after: float = COMPACT_FINISHED_AFTER,
    quiet_after: float = COMPACT_QUIET_AFTER,
) -> list[int]:
    """Runs with sample rows that are finished (any stored status but running) and silent for
    ``finished_after`` seconds, or silent for ``quiet_after`` seconds whatever their status:
    what the server's compactor and ``noisescope db compact`` compact."""
    now = utcnow()
    seen = func.coalesce(Run.last_seen_at, Run.started_at)
    finished = and_(Run.status != "running", seen < now - timedelta(seconds=finished_after))
    quiet = seen < now - timedelta(seconds=quiet_after)
    has_rows = exists().where(Sample.run_id == Run.id)
    stmt = select(Run.id).where(or_(finished, quiet), has_rows).order_by(Run.id)
    with engine.connect() as conn:
        return [int(r) for (r,) in conn.execute(stmt)]
