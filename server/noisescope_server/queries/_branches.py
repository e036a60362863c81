"""What a run's branch points read: the run, its branch runs with their outcomes (their last
``branch`` event), its evaluations and the examples it had seen at each branch step
(``noisescope_server.branches`` assembles them into ``RunBranches``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, func, select

from noisescope import protocol
from noisescope_server.models import BLOCK_SIZE, Event, Run, SampleBlock
from noisescope_server.queries._common import archived_filter, finite_number, scoped_run
from noisescope_server.queries._samples import sample_rows


@dataclass(frozen=True)
class RunBranchRows:
    """The stored facts of one run's branch points, read in one connection."""

    #: The run (``run_select``'s row: ``id``, ``uid``, ``units``, ...).
    parent: Any
    #: Its unarchived branch runs: ``id``, ``uid``, ``batch_size``, ``branch_step``, ``config``
    #: and ``units`` of each.
    kids: list[Any]
    #: Each branch run's last ``branch`` event's payload (its outcome), by run id.
    outcomes: dict[int, dict[str, Any]]
    #: The run's evaluation losses (step, loss) in step order; none read when it has no
    #: branch runs.
    parent_losses: list[tuple[int, float]]
    #: The most examples the run's samples at or before each branch step report, by step.
    parent_examples: dict[int, float | None]


def read_run_branches(
    engine: Engine, run_uid: str, *, project_scope: int | None = None
) -> RunBranchRows:
    """What ``run_uid``'s branch points are made of; raises ``NotFound`` / ``Forbidden`` as
    every read does."""
    with engine.connect() as conn:
        parent = scoped_run(conn, run_uid, project_scope)
        kids = conn.execute(
            select(Run.id, Run.uid, Run.batch_size, Run.branch_step, Run.config, Run.units).where(
                Run.parent_uid == run_uid,
                Run.project_id == parent.project_id,
                archived_filter(),  # an archived branch run is taken out of the points
            )
        ).all()
        outcomes = _latest_payloads(conn, [int(k.id) for k in kids], protocol.BRANCH_EVENT_KIND)
        # a run without branch runs (every run but a few) reads none of its evaluations
        parent_losses = _parent_losses(conn, int(parent.id)) if kids else []
        steps = sorted({int(k.branch_step or 0) for k in kids})
        parent_examples = {step: _examples_at(conn, int(parent.id), step) for step in steps}
    return RunBranchRows(
        parent=parent,
        kids=list(kids),
        outcomes=outcomes,
        parent_losses=parent_losses,
        parent_examples=parent_examples,
    )


def _latest_payloads(conn: Any, run_ids: list[int], kind: str) -> dict[int, dict[str, Any]]:
    """The last event of ``kind`` (highest step, then id) of each run."""
    if not run_ids:
        return {}
    last = (
        select(Event.run_id, func.max(Event.id).label("id"))
        .where(Event.run_id.in_(run_ids), Event.kind == kind)
        .group_by(Event.run_id)
        .subquery()
    )
    rows = conn.execute(select(Event.run_id, Event.payload).join(last, last.c.id == Event.id))
    return {int(r.run_id): dict(r.payload or {}) for r in rows}


def _parent_losses(conn: Any, run_id: int) -> list[tuple[int, float]]:
    rows = conn.execute(
        select(Event.step, Event.payload)
        .where(Event.run_id == run_id, Event.kind == protocol.EVAL_EVENT_KIND)
        .order_by(Event.step, Event.id)
    )
    out = []
    for r in rows:
        loss = finite_number((r.payload or {}).get("loss"))
        if loss is not None:
            out.append((int(r.step), loss))
    return out


def _examples_at(conn: Any, run_id: int, step: int) -> float | None:
    """The most examples (tokens) the run's samples at or before ``step`` report: whole blocks
    from ``sample_block``, the samples of the blocks ``step`` falls inside from ``sample``."""
    before = conn.execute(
        select(func.max(SampleBlock.examples_max)).where(
            SampleBlock.run_id == run_id, SampleBlock.step_max <= step
        )
    ).scalar()
    edge = conn.execute(
        select(func.min(SampleBlock.block), func.max(SampleBlock.block)).where(
            SampleBlock.run_id == run_id,
            SampleBlock.step_min <= step,
            SampleBlock.step_max > step,
            SampleBlock.block >= 0,  # seq blocks (a compacted layer's are keyed below 0)
        )
    ).one()
    inside = None
    if edge[0] is not None:
        samples = sample_rows(
            conn,
            run_id,
            ("step", "examples"),
            seq_lo=int(edge[0]) * BLOCK_SIZE,
            seq_hi=(int(edge[1]) + 1) * BLOCK_SIZE,
        )
        seen = [e for s, e in samples if s <= step and e is not None]
        inside = max(seen, default=None)
    found = [finite_number(v) for v in (before, inside)]
    return max((v for v in found if v is not None), default=None)
