"""A run's stored rows as they are: its events, and its raw samples streamed as CSV."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterator, Sequence
from typing import Any

from sqlalchemy import Engine, func, select

from noisescope.protocol import READ_COLUMNS, EventRow
from noisescope_server.jsonclip import clip_json
from noisescope_server.models import Event
from noisescope_server.queries._common import scoped_run
from noisescope_server.queries._samples import sample_rows


def run_events(
    engine: Engine,
    run_uid: str,
    *,
    kinds: Sequence[str] | None = None,
    exclude_kinds: Sequence[str] = (),
    max_events: int | None = None,
    project_scope: int | None = None,
) -> list[EventRow]:
    """A run's events (batch-size changes, evaluations, marks) in step order: of ``kinds``
    only (None: every kind) but none of ``exclude_kinds``; with ``max_events``, every k-th of
    them from the first (k = ceil(matching / max_events)), so a chart of a run with 100,000
    events reads a few thousand spread over the whole run, not the first few thousand."""
    with engine.connect() as conn:
        run = scoped_run(conn, run_uid, project_scope)
        where = [Event.run_id == run.id]
        if kinds is not None:
            where.append(Event.kind.in_(list(kinds)))
        if exclude_kinds:
            where.append(Event.kind.not_in(list(exclude_kinds)))
        columns = (Event.step, Event.kind, Event.payload, Event.time, Event.seq)
        stmt = select(*columns).where(*where).order_by(Event.step, Event.id)
        if max_events is not None:
            total = int(conn.execute(select(func.count()).where(*where)).scalar_one())
            every = -(-total // max_events)
            if every > 1:
                rank = func.row_number().over(order_by=(Event.step, Event.id)).label("rank")
                ranked = select(*columns, rank).where(*where).subquery()
                stmt = (
                    select(*(ranked.c[c.key] for c in columns))
                    .where((ranked.c.rank - 1) % every == 0)
                    .order_by(ranked.c.rank)
                )
        rows = conn.execute(stmt).all()
    return [
        EventRow(
            int(r[0]),
            str(r[1]),
            clip_json(r[2]) if isinstance(r[2], dict) else {},
            r[3],
            None if r[4] is None else int(r[4]),
        )
        for r in rows
    ]


def event_counts(
    engine: Engine, run_uid: str, *, project_scope: int | None = None
) -> dict[str, int]:
    """How many events of each kind a run holds (by kind name), for a reader that asks for a
    bounded number of them (``run_events(max_events=)``) and says how many it left out."""
    with engine.connect() as conn:
        run = scoped_run(conn, run_uid, project_scope)
        rows = conn.execute(
            select(Event.kind, func.count())
            .where(Event.run_id == run.id)
            .group_by(Event.kind)
            .order_by(Event.kind)
        ).all()
    return {str(kind): int(n) for kind, n in rows}


#: Every column a sample reads as, the derived estimates too (``protocol.READ_COLUMNS``).
CSV_COLUMNS = READ_COLUMNS


def raw_samples_csv(
    engine: Engine,
    run_uid: str,
    *,
    series: str | None = None,
    chunk_rows: int = 5000,
    project_scope: int | None = None,
) -> Iterator[str]:
    """Stream a run's raw samples as CSV text chunks (header first), in ``seq`` order.

    The run is checked before the first chunk is produced (so HTTP can still answer 404), then
    rows are read in ``chunk_rows`` pages by seq, keeping memory flat for any run length.
    """
    with engine.connect() as conn:
        run_id = int(scoped_run(conn, run_uid, project_scope).id)
    return _csv_chunks(engine, run_id, series, chunk_rows)


def _csv_chunks(engine: Engine, run_id: int, series: str | None, chunk_rows: int) -> Iterator[str]:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    yield buf.getvalue()
    after = -(2**63)
    while True:
        with engine.connect() as conn:
            rows = sample_rows(
                conn, run_id, CSV_COLUMNS, series=series, seq_lo=after, limit=chunk_rows
            )
        if not rows:
            return
        buf.seek(0)
        buf.truncate()
        writer.writerows(_csv_row(r) for r in rows)
        yield buf.getvalue()
        after = int(rows[-1][0]) + 1


def _csv_row(row: Sequence[Any]) -> list[Any]:
    return [
        "" if v is None else (repr(v) if isinstance(v, float) and math.isfinite(v) else v)
        for v in row
    ]
