"""Run events (batch-size changes, evals, marks); those that carry a seq are insert-or-ignore."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine

from noisescope_server.crud._runs import require_run
from noisescope_server.crud._sql import TOUCH_RUN, dialect_insert
from noisescope_server.db import write_transaction
from noisescope_server.models import Event
from noisescope_server.utc import utcnow


@dataclass(frozen=True)
class EventIn:
    step: int
    kind: str
    payload: dict[str, Any] = field(default_factory=dict)
    time: float | None = None
    seq: int | None = None


def ingest_events(
    engine: Engine, run_uid: str, events: Sequence[EventIn], *, project_scope: int | None = None
) -> int:
    """Insert events (batch-size changes, marks); events with a ``seq`` are insert-or-ignore."""
    with write_transaction(engine) as conn:
        run = require_run(conn, run_uid, project_scope)
        conn.execute(TOUCH_RUN, {"run_id": run.id, "now": utcnow()})
        if not events:
            return 0
        rows = [
            {
                "run_id": run.id,
                "seq": e.seq,
                "step": e.step,
                "kind": e.kind,
                "payload": e.payload,
                "time": e.time,
            }
            for e in events
        ]
        ins = dialect_insert(conn.dialect.name)(Event)
        inserted = 0
        for e_row in rows:  # few events per request; rowcount per row is portable
            result = conn.execute(
                ins.values(**e_row).on_conflict_do_nothing(),
                execution_options={"preserve_rowcount": True},
            )
            inserted += result.rowcount
        return inserted
