"""Projects and the per-task summary across runs."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any, NamedTuple

from sqlalchemy import Connection, Engine, select

from noisescope import protocol
from noisescope.estimators import CURRENT_MIN_SAMPLES
from noisescope.protocol import TaskSummary
from noisescope_server.models import Project, Run, RunDigest, Task
from noisescope_server.queries._common import archived_filter, fetch_tuples, run_status
from noisescope_server.queries._current import read_current
from noisescope_server.queries._runs import ID_CHUNK, sample_counts, stored_current
from noisescope_server.utc import as_utc

#: The most runs one task list reads the current window of from their samples: those whose
#: digest is missing or older than their newest whole-model sample, the farthest behind first.
#: The others are taken from their digests as last stored (or unmeasured where none is) and
#: counted in ``TaskSummary.n_behind``; the server's digest keeper stores them again within
#: seconds. With up to this many runs logging between the keeper's looks the list is exact;
#: at thousands it stays within its time (docs/benchmarks.md, the task list at team size) and
#: says how many runs lag.
STALE_READ_LIMIT = 100


def list_projects(engine: Engine, *, project_scope: int | None = None) -> list[str]:
    """Project names in order (only the scoped one under ``project_scope``)."""
    stmt = select(Project.name).order_by(Project.name)
    if project_scope is not None:
        stmt = stmt.where(Project.id == project_scope)
    with engine.connect() as conn:
        return [str(r[0]) for r in conn.execute(stmt)]


def task_summaries(
    engine: Engine,
    project: str | None = None,
    *,
    project_scope: int | None = None,
    crash_after: float = protocol.CRASH_AFTER,
) -> list[TaskSummary]:
    """One row per (project, task), for cross-task comparison; archived runs count in none.

    The runs' fields in one query and their current B_simple (``_currents``): the values of
    ``list_runs``, without the rest of a run summary, so thousands of runs answer in one pass;
    for runs beyond ``STALE_READ_LIMIT`` whose digest lags, the digest's, counted behind."""
    stmt = (
        select(
            Run.id,
            Project.name,
            Task.name,
            run_status(crash_after),
            Run.batch_size,
            Run.units,
            Run.started_at,
        )
        .join(Project, Project.id == Run.project_id)
        .join(Task, Task.id == Run.task_id)
        .where(archived_filter("exclude"))
    )
    if project is not None:
        stmt = stmt.where(Project.name == project)
    if project_scope is not None:
        stmt = stmt.where(Run.project_id == project_scope)
    with engine.connect() as conn:
        rows = conn.execute(stmt).all()
        measured = _currents(conn, [int(r[0]) for r in rows])
    groups: dict[tuple[str, str], list[Any]] = {}
    for r in rows:
        groups.setdefault((str(r[1]), str(r[2])), []).append(r)
    out = []
    for (proj, task), members in sorted(groups.items()):
        found = [measured[int(r[0])] for r in members]
        b_values = [m.b_simple for m in found if m.b_simple is not None]
        starts = [as_utc(r[6]) for r in members if r[6] is not None]
        out.append(
            TaskSummary(
                project=proj,
                task=task,
                n_runs=len(members),
                n_running=sum(r[3] == "running" for r in members),
                n_samples=sum(m.n_samples for m in found),
                batch_sizes=sorted({r[4] for r in members if r[4] is not None}),
                units=sorted({str(r[5]) for r in members}),
                last_started_at=max(starts) if starts else None,
                n_measured=len(b_values),
                b_simple_median=statistics.median(b_values) if b_values else None,
                b_simple_min=min(b_values) if b_values else None,
                b_simple_max=max(b_values) if b_values else None,
                n_behind=sum(m.behind for m in found),
                n_unread=sum(m.unread for m in found),
            )
        )
    return out


class _Current(NamedTuple):
    """A run's whole-model sample count and current B_simple as the task list takes it."""

    n_samples: int
    b_simple: float | None
    #: Read before the run's newest whole-model samples (or not read at all).
    behind: bool = False
    #: Not read at all: no digest of this run's (so unmeasured here, whatever its samples).
    unread: bool = False


def _currents(conn: Connection, run_ids: Sequence[int]) -> dict[int, _Current]:
    """Each run's current B_simple: from its digest where that was read at the run's present
    whole-model count (the window reads no other series), else from its samples, up to
    ``STALE_READ_LIMIT`` runs farthest behind first; beyond it, the digest as it is."""
    out: dict[int, _Current] = {}
    # (samples behind, run, its count, the digest's value, whether it has a digest)
    lagging: list[tuple[int, int, int, float | None, bool]] = []
    for lo in range(0, len(run_ids), ID_CHUNK):
        ids = list(run_ids[lo : lo + ID_CHUNK])
        found = sample_counts(conn, ids)
        stored = select(RunDigest.run_id, RunDigest.n_samples, RunDigest.current)
        digests = {
            int(r): (int(n), stored_current(str(fields)))
            for r, n, fields in fetch_tuples(conn, stored.where(RunDigest.run_id.in_(ids)))
        }
        for run_id in ids:
            n = found.get(run_id, (0, 0))[0]
            digest_n, fields = digests.get(run_id, (0, None))
            if n < CURRENT_MIN_SAMPLES:  # no window to read: nothing lags
                out[run_id] = _Current(n, None)
            elif fields is not None and digest_n == n:
                out[run_id] = _Current(n, fields["b_simple"])
            elif fields is None or digest_n > n:  # none, or not this run's (counts grow)
                lagging.append((n, run_id, n, None, False))
            else:
                lagging.append((n - digest_n, run_id, n, fields["b_simple"], True))
    lagging.sort(key=lambda lag: (-lag[0], lag[1]))
    for k, (_, run_id, n, value, digested) in enumerate(lagging):
        if k < STALE_READ_LIMIT:
            out[run_id] = _Current(n, read_current(conn, run_id, n)["b_simple"])
        else:
            out[run_id] = _Current(n, value, behind=True, unread=not digested)
    return out
