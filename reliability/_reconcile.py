"""Reconciliation by SQL: what the clients logged against what the database holds.

Every stored row is checked against the deterministic generator (``_client.sample_values``):
the per-run count, distinct seq count, seq range and sums of the squared norms must equal what
was logged, and the pre-aggregated ``sample_block`` counts must add up to the row count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import text

from noisescope_server.queries._samples import sample_rows
from reliability._client import sample_values
from reliability._infra import engine_for


@dataclass
class RunCheck:
    run_id: str
    logged: int
    stored: int
    distinct: int
    block_n: int
    values_ok: bool
    missing: int

    @property
    def duplicates(self) -> int:
        return self.stored - self.distinct


@dataclass
class Reconciliation:
    runs: list[RunCheck] = field(default_factory=list)

    @property
    def logged(self) -> int:
        return sum(r.logged for r in self.runs)

    @property
    def stored(self) -> int:
        return sum(r.stored for r in self.runs)

    @property
    def duplicates(self) -> int:
        return sum(r.duplicates for r in self.runs)

    @property
    def missing(self) -> int:
        return sum(r.missing for r in self.runs)

    @property
    def exact(self) -> bool:
        return all(
            r.stored == r.logged == r.distinct == r.block_n and r.values_ok and not r.missing
            for r in self.runs
        )

    def line(self) -> str:
        return (
            f"logged {self.logged}, stored {self.stored}, duplicates {self.duplicates}, "
            f"missing {self.missing}, values {'match' if self.values_ok else 'DIFFER'}"
        )

    @property
    def values_ok(self) -> bool:
        return all(r.values_ok for r in self.runs)


def _expected_sums(seed: int, seqs: Any) -> tuple[float, float]:
    g_small = g_big = 0.0
    for i in seqs:
        gs, gb, _ = sample_values(seed, i)
        g_small += gs
        g_big += gb
    return g_small, g_big


def stored_seqs(engine: Any, run_id: str) -> list[int]:
    """The seqs the server holds for ``run_id``, rows and compacted chunks alike (the server's
    one read seam of samples), in order; none for an unknown run."""
    with engine.connect() as conn:
        found = conn.execute(text("SELECT id FROM run WHERE uid = :uid"), {"uid": run_id})
        run = found.scalar_one_or_none()
        if run is None:
            return []
        return [int(seq) for (seq,) in sample_rows(conn, int(run), ["seq"])]


def stored_count(url: str, run_id: str) -> int:
    """How many samples the server at database ``url`` holds for ``run_id``."""
    engine = engine_for(url)
    try:
        return len(stored_seqs(engine, run_id))
    finally:
        engine.dispose()


def check_run(engine: Any, run_id: str, seed: int, logged: int) -> RunCheck:
    """Compare one run's stored rows with the ``logged`` samples 0..logged-1 of ``seed``."""
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT count(*), count(DISTINCT s.seq), min(s.seq), max(s.seq), "
                "sum(s.g_small_sq), sum(s.g_big_sq) "
                "FROM sample s JOIN run r ON r.id = s.run_id WHERE r.uid = :uid"
            ),
            {"uid": run_id},
        ).one()
        block_n = conn.execute(
            text(
                "SELECT coalesce(sum(b.n), 0) FROM sample_block b JOIN run r ON r.id = b.run_id "
                "WHERE r.uid = :uid"
            ),
            {"uid": run_id},
        ).scalar_one()
    stored, distinct = int(row[0]), int(row[1])
    lo, hi = row[2], row[3]
    in_range = stored == 0 or (int(lo) >= 0 and int(hi) < logged)
    if stored == distinct == logged and in_range:
        seqs: Any = range(logged)
        missing = 0
    else:  # partial: compare the rows that are there
        seqs = stored_seqs(engine, run_id)
        missing = logged - len(set(seqs) & set(range(logged)))
    exp_small, exp_big = _expected_sums(seed, seqs)
    got_small, got_big = float(row[4] or 0.0), float(row[5] or 0.0)
    values_ok = (
        in_range
        and math.isclose(got_small, exp_small, rel_tol=1e-9, abs_tol=1e-6)
        and math.isclose(got_big, exp_big, rel_tol=1e-9, abs_tol=1e-6)
    )
    return RunCheck(run_id, logged, stored, distinct, int(block_n), values_ok, missing)


def reconcile(engine: Any, runs: list[tuple[str, int, int]]) -> Reconciliation:
    """``runs``: (run_id, seed, samples logged) of every simulated run."""
    return Reconciliation([check_run(engine, rid, seed, n) for rid, seed, n in runs])


def table_checksum(engine: Any) -> str:
    """A digest of every stored sample, series name, block, run (with its config), event,
    project and token row: unchanged means nothing was corrupted or added by a rejected
    request. ``last_seen_at`` is left out: an accepted re-send is a sign of life, not a change
    of data."""
    import hashlib

    digest = hashlib.sha256()
    queries = [
        "SELECT run_id, seq, step, b_small, b_big, g_small_sq, g_big_sq, loss, lr, time, "
        "series_id FROM sample ORDER BY run_id, seq",
        "SELECT run_id, id, name FROM series ORDER BY run_id, id",
        "SELECT id, uid, project_id, task_id, name, status, batch_size, config, tags FROM run "
        "ORDER BY id",
        "SELECT id, run_id, seq, step, kind, payload, time FROM event ORDER BY id",
        "SELECT run_id, series_id, block, n, sum_g_sq FROM sample_block "
        "ORDER BY run_id, series_id, block",
        "SELECT id, name FROM project ORDER BY id",
        "SELECT id, project_id, token_hash, revoked_at FROM token ORDER BY id",
    ]
    with engine.connect() as conn:
        for q in queries:
            for r in conn.execute(text(q)):
                digest.update(repr(tuple(r)).encode())
    return digest.hexdigest()
