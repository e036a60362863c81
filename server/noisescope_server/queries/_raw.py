"""A run's stored rows as they are: its events, and its raw samples streamed as CSV."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterator, Sequence
from typing import Any

from sqlalchemy import Engine, select

from noisescope.protocol import EventRow
from noisescope_server.jsonclip import clip_json
from noisescope_server.models import SAMPLE_COLUMNS, Event, Sample
from noisescope_server.queries._common import scoped_run


def run_events(engine: Engine, run_uid: str, *, project_scope: int | None = None) -> list[EventRow]:
    """A run's events (batch-size changes, marks) in step order."""
    with engine.connect() as conn:
        run = scoped_run(conn, run_uid, project_scope)
        rows = conn.execute(
            select(Event.step, Event.kind, Event.payload, Event.time, Event.seq)
            .where(Event.run_id == run.id)
            .order_by(Event.step, Event.id)
        ).all()
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


CSV_COLUMNS = SAMPLE_COLUMNS


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
    cols = [getattr(Sample, c) for c in CSV_COLUMNS]
    after = -1
    while True:
        stmt = select(*cols).where(Sample.run_id == run_id, Sample.seq > after)
        if series is not None:
            stmt = stmt.where(Sample.series == series)
        with engine.connect() as conn:
            rows = conn.execute(stmt.order_by(Sample.seq).limit(chunk_rows)).all()
        if not rows:
            return
        buf.seek(0)
        buf.truncate()
        writer.writerows(_csv_row(r) for r in rows)
        yield buf.getvalue()
        after = int(rows[-1][0])


def _csv_row(row: Sequence[Any]) -> list[Any]:
    return [
        "" if v is None else (repr(v) if isinstance(v, float) and math.isfinite(v) else v)
        for v in row
    ]
