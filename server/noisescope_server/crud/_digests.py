"""Run digests (``models.RunDigest``): what a run list computes per run from its samples
(its current window and last loss), stored so that lists of thousands of runs read one row
per run.

A digest is valid for the sample counts it was read at, and counts only grow: the run list
reads a run whose counts moved on from its samples; the task list too, up to
``queries.STALE_READ_LIMIT`` runs, and takes the others' as they are, counted behind
(``TaskSummary.n_behind``). The server's digest keeper (``compactor``, every
``DIGEST_EVERY`` seconds) stores the stale ones, and compaction a compacted run's.

Not stored with each ingest request: reading a run's window costs more CPU than a small
request's own insert (docs/benchmarks.md, the task list at team size), for every request of
every live run, where the keeper reads it once per look.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, and_

from noisescope_server.crud._sql import dialect_insert
from noisescope_server.db import write_transaction
from noisescope_server.models import RunDigest

#: Runs whose digests are read, then stored in one transaction (``refresh_digests``).
DIGEST_BATCH = 100


def _upsert(conn: Connection, digests: Sequence[tuple[int, int, int, str, float | None]]) -> None:
    """Store digests over older ones; never over one read at larger counts (counts only grow:
    two transactions storing one run's digest at once keep the later samples' one)."""
    rows = [
        {"run_id": run_id, "n_samples": n, "n_all": n_all, "current": fields, "last_loss": loss}
        for run_id, n, n_all, fields, loss in digests
    ]
    if not rows:
        return
    stmt = dialect_insert(conn.dialect.name)(RunDigest)
    names = ("n_samples", "n_all", "current", "last_loss")
    excluded: dict[str, Any] = {name: getattr(stmt.excluded, name) for name in names}
    newer = and_(
        RunDigest.n_samples <= stmt.excluded.n_samples, RunDigest.n_all <= stmt.excluded.n_all
    )
    upsert = stmt.on_conflict_do_update(index_elements=["run_id"], set_=excluded, where=newer)
    conn.execute(upsert, rows)


def store_digests(engine: Engine, run_ids: Sequence[int]) -> int:
    """Store what a run list computes for each run, read now; the digests stored. A run that
    got a sample while it was read is left for the next time (counts only grow: the same counts
    before and after mean the digest was read from exactly the samples it is valid for), as is
    one deleted meanwhile."""
    from noisescope_server import queries

    with engine.connect() as conn:
        digests = queries.run_digests(conn, run_ids)
    if not digests:
        return 0
    with write_transaction(engine) as conn:
        now = queries.sample_counts(conn, [d[0] for d in digests])
        kept = [d for d in digests if now.get(d[0]) == (d[1], d[2])]
        _upsert(conn, kept)
    return len(kept)


def refresh_digests(
    engine: Engine,
    *,
    stop: Callable[[], bool] | None = None,
    touched_since: datetime | None = None,
) -> int:
    """Store the digest of every run that has none or a stale one (``queries.stale_digests``;
    with ``touched_since``, among the runs written to since then); the digests stored."""
    from noisescope_server import queries

    with engine.connect() as conn:
        due = queries.stale_digests(conn, touched_since=touched_since)
    stored = 0
    for lo in range(0, len(due), DIGEST_BATCH):
        if stop is not None and stop():
            break
        stored += store_digests(engine, due[lo : lo + DIGEST_BATCH])
    return stored
