"""The run list and one run's summary: the facts read for many runs at once, and each run's
current B_simple beside them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Connection, Engine, case, func, or_, select

from noisescope import protocol, sweep
from noisescope.estimators import training_loss_curve
from noisescope.protocol import RunSummary
from noisescope_server.jsonclip import clip_json
from noisescope_server.models import (
    WHOLE_MODEL,
    Event,
    Project,
    Run,
    RunDigest,
    SampleBlock,
    Task,
)
from noisescope_server.queries._common import (
    LEVEL,
    MIN_EVALS,
    archived_filter,
    fetch_tuples,
    finite_number,
    json_value,
    run_select,
    run_status,
    scoped_run,
)
from noisescope_server.queries._current import CurrentFields, no_current, read_current
from noisescope_server.queries._samples import last_rows
from noisescope_server.utc import as_utc

#: ``b_simple_reason`` of runs listed with ``current=False``.
NOT_COMPUTED = "not computed: the run was listed without its current B_simple (current=false)"

#: Run ids per ``IN (...)`` of the set-based run queries (SQLite bounds bound parameters).
ID_CHUNK = 900


@dataclass(frozen=True)
class _RunFacts:
    """What the run list reads for all its runs at once (a handful of queries, not per run)."""

    n_samples: dict[int, int]
    last: dict[int, tuple[int, float | None]]
    events: dict[tuple[int, str], dict[str, Any]]
    #: Why a run's loss diverged (``sweep.divergence``), for the runs whose loss did.
    diverged: dict[int, str]
    #: Runs with no whole-model sample but per-layer ones: their series and samples.
    layers_only: dict[int, tuple[int, int]]
    #: Samples in all series, and the stored digests of compacted runs (``RunDigest``).
    n_all: dict[int, int]
    digests: dict[int, tuple[int, int, str, float | None]]


def _run_facts(conn: Connection, run_ids: Sequence[int]) -> _RunFacts:
    """Sample counts, last step and examples (from the block table) and the latest event of
    each kind that means something (eval, batch_size, notice), for many runs at once."""
    n_samples: dict[int, int] = {}
    layers_only: dict[int, tuple[int, int]] = {}
    last: dict[int, tuple[int, float | None]] = {}
    events: dict[tuple[int, str], dict[str, Any]] = {}
    n_all: dict[int, int] = {}
    digests: dict[int, tuple[int, int, str, float | None]] = {}
    kinds = [protocol.EVAL_EVENT_KIND, protocol.BATCH_SIZE_EVENT_KIND, protocol.NOTICE_EVENT_KIND]
    for lo in range(0, len(run_ids), ID_CHUNK):
        ids = list(run_ids[lo : lo + ID_CHUNK])
        counts = select(SampleBlock.run_id, func.sum(SampleBlock.n)).where(
            SampleBlock.run_id.in_(ids), SampleBlock.series_id == WHOLE_MODEL
        )
        for run_id, n in fetch_tuples(conn, counts.group_by(SampleBlock.run_id)):
            n_samples[int(run_id)] = int(n or 0)
        bare = [i for i in ids if not n_samples.get(i)]
        if bare:  # what the runs without a whole-model sample logged instead, if anything
            layers = select(
                SampleBlock.run_id,
                func.count(SampleBlock.series_id.distinct()),
                func.sum(SampleBlock.n),
            ).where(SampleBlock.run_id.in_(bare), SampleBlock.series_id != WHOLE_MODEL)
            for run_id, k, n in fetch_tuples(conn, layers.group_by(SampleBlock.run_id)):
                layers_only[int(run_id)] = (int(k), int(n or 0))
        # steps and examples only grow with seq: the largest over all series is the last
        ends = select(
            SampleBlock.run_id,
            func.max(SampleBlock.step_max),
            func.max(SampleBlock.examples_max),
            func.sum(SampleBlock.n),
        ).where(SampleBlock.run_id.in_(ids))
        for run_id, step, examples, n in fetch_tuples(conn, ends.group_by(SampleBlock.run_id)):
            last[int(run_id)] = (int(step), None if examples is None else float(examples))
            n_all[int(run_id)] = int(n or 0)
        stored = select(
            RunDigest.run_id,
            RunDigest.n_samples,
            RunDigest.n_all,
            RunDigest.current,
            RunDigest.last_loss,
        ).where(RunDigest.run_id.in_(ids))
        for run_id, n, n_any, fields, loss in fetch_tuples(conn, stored):
            digests[int(run_id)] = (int(n), int(n_any), str(fields), loss)
        rank = (
            func.row_number()
            .over(
                partition_by=(Event.run_id, Event.kind),
                order_by=(Event.step.desc(), Event.id.desc()),
            )
            .label("rank")
        )
        ranked = (
            select(Event.run_id, Event.kind, Event.payload, rank)
            .where(Event.run_id.in_(ids), Event.kind.in_(kinds))
            .subquery()
        )
        latest = select(ranked.c.run_id, ranked.c.kind, ranked.c.payload).where(ranked.c.rank == 1)
        for run_id, kind, payload in conn.execute(latest):
            if isinstance(payload, dict):
                events[(int(run_id), str(kind))] = dict(payload)
    diverged = _diverged(conn, run_ids)
    return _RunFacts(n_samples, last, events, diverged, layers_only, n_all, digests)


def _diverged(conn: Connection, run_ids: Sequence[int]) -> dict[int, str]:
    """Why each run's loss diverged, judged by ``sweep.divergence`` on the curve the sweep
    analysis crosses targets on: its evaluations when it logged ``MIN_EVALS``, else its
    training loss smoothed alike (``estimators.training_loss_curve``), here read at the block
    table's resolution (64 samples a point) so the run list stays a few queries at any run
    length."""
    evals: dict[int, list[tuple[float, float]]] = {}
    train: dict[int, tuple[list[float], list[float], list[float]]] = {}
    for lo in range(0, len(run_ids), ID_CHUNK):
        ids = list(run_ids[lo : lo + ID_CHUNK])
        q = (
            select(Event.run_id, Event.step, Event.payload)
            .where(Event.run_id.in_(ids), Event.kind == protocol.EVAL_EVENT_KIND)
            .order_by(Event.run_id, Event.step, Event.id)
        )
        for run_id, step, raw in fetch_tuples(conn, q):  # plain rows: a run may log 100,000
            payload = json_value(raw)
            value = finite_number(payload.get("loss")) if isinstance(payload, dict) else None
            if value is not None:
                evals.setdefault(int(run_id), []).append((float(step), value))
        b = SampleBlock
        blocks = (
            select(b.run_id, b.step_min, b.step_max, b.n_loss, b.sum_loss)
            .where(b.run_id.in_(ids), b.series_id == WHOLE_MODEL, b.n_loss > 0)
            .order_by(b.run_id, b.block)
        )
        for run_id, step_min, step_max, n_loss, sum_loss in fetch_tuples(conn, blocks):
            steps, losses, weights = train.setdefault(int(run_id), ([], [], []))
            steps.append((float(step_min) + float(step_max)) / 2.0)
            losses.append(float(sum_loss) / float(n_loss))
            weights.append(float(n_loss))
    out = {}
    for run_id in run_ids:
        points = evals.get(run_id, [])
        if len(points) >= MIN_EVALS:
            why = sweep.divergence([p[0] for p in points], [p[1] for p in points])
            curve = "evaluation loss"
        elif run_id in train:
            why = sweep.divergence(*training_loss_curve(*train[run_id]))
            curve = "training loss (smoothed)"
        else:
            why = None
        if why is not None:
            out[run_id] = f"{curve}: {why}"
    return out


def _positive(value: Any) -> float | None:
    number = finite_number(value)
    return number if number is not None and number > 0 else None


def sample_counts(conn: Connection, run_ids: Sequence[int]) -> dict[int, tuple[int, int]]:
    """Each run's whole-model and total sample counts (from the block sums), for the runs that
    have a sample: what a stored digest is valid for (``RunDigest``)."""
    found: dict[int, tuple[int, int]] = {}
    for lo in range(0, len(run_ids), ID_CHUNK):
        ids = list(run_ids[lo : lo + ID_CHUNK])
        counts = _COUNTS.where(SampleBlock.run_id.in_(ids)).group_by(SampleBlock.run_id)
        found |= {int(r): (int(n or 0), int(a or 0)) for r, n, a in fetch_tuples(conn, counts)}
    return found


_COUNTS = select(
    SampleBlock.run_id,
    func.sum(case((SampleBlock.series_id == WHOLE_MODEL, SampleBlock.n), else_=0)),
    func.sum(SampleBlock.n),
)


def stale_digests(conn: Connection, *, touched_since: datetime | None = None) -> list[int]:
    """The runs with samples whose digest is missing or was stored before their last sample
    came: those whose window a list reads sample by sample, in id order. With
    ``touched_since``, only among the runs a write touched since then (every ingest touches
    its run): the block sums of the others are not read."""
    counts = _COUNTS.group_by(SampleBlock.run_id)
    if touched_since is not None:
        touched = select(Run.id).where(Run.last_seen_at >= touched_since)
        counts = counts.where(SampleBlock.run_id.in_(touched))
    stored = {
        int(r): (int(n), int(a))
        for r, n, a in fetch_tuples(
            conn, select(RunDigest.run_id, RunDigest.n_samples, RunDigest.n_all)
        )
    }
    return sorted(
        int(r)
        for r, n, a in fetch_tuples(conn, counts)
        if stored.get(int(r)) != (int(n or 0), int(a or 0))
    )


def stored_current(text: str) -> CurrentFields | None:
    """A digest's current window, or None where it was stored with other fields than
    ``CurrentFields`` has now (by an older version): then the window is read again."""
    fields = json.loads(text)
    if not isinstance(fields, dict) or set(fields) != set(CurrentFields.__annotations__):
        return None
    return cast(CurrentFields, fields)


def run_digests(
    conn: Connection, run_ids: Sequence[int]
) -> list[tuple[int, int, int, str, float | None]]:
    """What ``RunDigest`` stores for each run with samples, read now: its id, whole-model and
    total sample counts, its current window (``read_current``) as JSON text, and its last
    loss."""
    out = []
    for run_id, (n_samples, n_all) in sorted(sample_counts(conn, run_ids).items()):
        fields = read_current(conn, run_id, n_samples)
        out.append((run_id, n_samples, n_all, json.dumps(fields), _last_loss(conn, run_id)))
    return out


def _last_loss(conn: Connection, run_id: int) -> float | None:
    """The loss of a run's newest sample that has one."""
    found = last_rows(conn, run_id, ("loss",), 1, not_null="loss")
    return float(found[0][0]) if found else None


def _no_whole_model(uid: str, layers: tuple[int, int] | None) -> str:
    """Why a run without whole-model samples has no current B_simple: none at all yet, or
    only per-layer series. The current B_simple is the whole model's (series ""); the layers
    need not add up to it (a probe's named groups may leave parameters out), so none of them,
    nor their sum, stands in for it."""
    if layers is None:
        return "no samples yet"
    series, samples = layers
    return (
        f"no whole-model samples: the run logged {series:,} per-layer series "
        f"({samples:,} samples) and no whole-model series "
        f'(series ""), which the current B_simple reads; read a layer\'s own B_simple with '
        f"GET {protocol.API_PREFIX}/runs/{uid}/series?series=NAME (series-names lists them)"
    )


def _summarise(conn: Connection, row: Any, facts: _RunFacts, *, current: bool = True) -> RunSummary:
    run_id = int(row.id)
    n_samples = facts.n_samples.get(run_id, 0)
    last = facts.last.get(run_id)
    digest = facts.digests.get(run_id)
    stored = None
    if digest is not None and digest[:2] == (n_samples, facts.n_all.get(run_id, 0)):
        stored = stored_current(digest[2])  # else a sample came after it was stored
    last_loss = digest[3] if digest is not None and stored is not None else _last_loss(conn, run_id)
    evaluation = facts.events.get((run_id, protocol.EVAL_EVENT_KIND))
    change = facts.events.get((run_id, protocol.BATCH_SIZE_EVENT_KIND))
    notice = facts.events.get((run_id, protocol.NOTICE_EVENT_KIND))
    in_use = _positive(change.get("batch_size")) if change else None
    source = "event" if in_use is not None else None
    if in_use is None and _positive(row.batch_size) is not None:
        in_use, source = float(row.batch_size), "run"
    if not current:
        now = no_current(NOT_COMPUTED)
    elif n_samples == 0:
        reason = _no_whole_model(str(row.uid), facts.layers_only.get(run_id))
        if notice and isinstance(notice.get("message"), str):
            reason += f": {notice['message']}"
        now = no_current(reason)
    elif stored is not None:
        now = stored
    else:
        now = read_current(conn, run_id, n_samples)
    b_simple = now["b_simple"]
    return RunSummary(
        uid=str(row.uid),
        project=str(row.project),
        task=str(row.task),
        name=str(row.name),
        tags=clip_json(row.tags) if isinstance(row.tags, list) else [],
        config=clip_json(row.config) if isinstance(row.config, dict) else {},
        batch_size=row.batch_size,
        units=str(row.units),
        status=str(row.status),
        started_at=as_utc(row.started_at),
        ended_at=as_utc(row.ended_at),
        last_seen_at=as_utc(row.last_seen_at),
        n_samples=n_samples,
        last_step=None if last is None else last[0],
        last_examples=None if last is None else last[1],
        last_loss=None if last_loss is None else float(last_loss),
        last_eval_loss=finite_number(evaluation.get("loss")) if evaluation else None,
        batch_in_use=in_use,
        batch_in_use_source=source,
        level=LEVEL,
        **now,
        batch_to_b_simple=(in_use / b_simple if in_use is not None and b_simple else None),
        notice=str(notice["message"])
        if notice and isinstance(notice.get("message"), str)
        else None,
        parent_uid=row.parent_uid,
        branch_step=None if row.branch_step is None else int(row.branch_step),
        diverged=run_id in facts.diverged,
        diverged_reason=facts.diverged.get(run_id),
        archived_at=as_utc(getattr(row, "archived_at", None)),
    )


def _sorted_start() -> Any:
    """When a run started, for the newest-first order: ``started_at``, unless it lies after the
    run was last heard from (a row stored before the server clamped times from skewed clocks,
    ``crud.not_ahead``: a client a day ahead) - then that time, on the server's clock, so such a
    run does not sort as the newest for a day."""
    seen = func.coalesce(Run.last_seen_at, Run.started_at)
    return case((Run.started_at > seen, seen), else_=Run.started_at)


def list_runs(
    engine: Engine,
    *,
    project: str | None = None,
    task: str | None = None,
    tag: str | None = None,
    status: str | None = None,
    search: str | None = None,
    started_after: datetime | None = None,
    started_before: datetime | None = None,
    limit: int = 200,
    project_scope: int | None = None,
    current: bool = True,
    crash_after: float = protocol.CRASH_AFTER,
    archived: str = "exclude",
) -> list[RunSummary]:
    """Runs, newest first, filtered by project/task name, tag, status (as ``run_status``
    reads it), a case-insensitive substring of name/uid/task (``search``) and start time; each
    with its current B_simple (``current=False`` skips that window, for callers that only need
    the runs). Archived runs are left out unless ``archived`` is "include" or "only"."""
    stmt = run_select(crash_after).order_by(_sorted_start().desc(), Run.id.desc())
    stmt = stmt.where(archived_filter(archived))
    if project is not None:
        stmt = stmt.where(Project.name == project)
    if task is not None:
        stmt = stmt.where(Task.name == task)
    if status is not None:
        stmt = stmt.where(run_status(crash_after) == status)
    if started_after is not None:
        stmt = stmt.where(Run.started_at >= started_after)
    if started_before is not None:
        stmt = stmt.where(Run.started_at < started_before)
    if project_scope is not None:
        stmt = stmt.where(Run.project_id == project_scope)
    if search:
        # a literal substring: LIKE wildcards and the escape character are escaped, and both
        # sides are lowered by the database (SQLite's lower() leaves non-ASCII as is, so a
        # Python-lowered pattern would never match a name like "Ωμέγα")
        escaped = search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        pattern = func.lower(f"%{escaped}%")
        stmt = stmt.where(
            or_(
                func.lower(Run.name).like(pattern, escape="\\"),
                func.lower(Run.uid).like(pattern, escape="\\"),
                func.lower(Task.name).like(pattern, escape="\\"),
            )
        )
    if tag is None:  # (a tag is matched below, so its rows are all read)
        stmt = stmt.limit(max(limit, 0))
    with engine.connect() as conn:
        rows = conn.execute(stmt).all()
        if tag is not None:  # JSON containment is not portable; tags lists are short
            rows = [r for r in rows if tag in (r.tags or [])]
        rows = rows[: max(limit, 0)]
        facts = _run_facts(conn, [int(r.id) for r in rows])
        return [_summarise(conn, r, facts, current=current) for r in rows]


def get_run(
    engine: Engine,
    run_uid: str,
    *,
    project_scope: int | None = None,
    crash_after: float = protocol.CRASH_AFTER,
) -> RunSummary:
    """One run's summary; raises ``errors.NotFound`` for an unknown uid."""
    with engine.connect() as conn:
        row = scoped_run(conn, run_uid, project_scope, crash_after)
        return _summarise(conn, row, _run_facts(conn, [int(row.id)]))
