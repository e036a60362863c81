"""The one write path: every row noisescope stores goes through this module.

Each public function runs in ONE transaction (``db.write_transaction``): a request either lands
completely or not at all, so a bad or interrupted request never leaves partial data.

Sample ingest stays thin on purpose (issue 9: >= 50% of the raw driver's executemany rate end to
end): columns are validated as whole arrays (no object per sample), the per-sample unbiased
estimates |𝒢|^2 and 𝒮 (science.md, two-batch estimator) come from
``noisescope.estimators.two_batch_estimates`` so SQL only ever sums them, and rows go to the
driver with one ``executemany`` (SQLite) or one ``unnest`` INSERT per chunk (PostgreSQL), both
insert-or-ignore on (run_id, seq) so a re-sent batch never duplicates.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import math
import operator
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from itertools import repeat
from typing import Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Connection,
    Double,
    Engine,
    String,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.dialects import sqlite
from sqlalchemy.sql.expression import Executable

from noisescope import _wire
from noisescope.estimators import two_batch_estimates
from noisescope_server.db import write_transaction
from noisescope_server.models import (
    BLOCK_SIZE,
    SAMPLE_COLUMNS,
    Event,
    Project,
    Run,
    Sample,
    SampleBlock,
    Task,
    Token,
)

__all__ = [
    "BadInput",
    "Conflict",
    "EventIn",
    "Forbidden",
    "NotFound",
    "RunIn",
    "SampleBatch",
    "TokenCreated",
    "create_token",
    "hash_token",
    "ingest_events",
    "ingest_samples",
    "patch_run",
    "revoke_token",
    "upsert_run",
    "validate_samples",
]

#: Rows per INSERT statement: bounds statement size and lock hold time on both backends.
CHUNK_ROWS = 5_000
_INT64_MAX = 2**63 - 1
RUN_UID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class BadInput(ValueError):
    """The request is malformed; the message says what to fix. Maps to 4xx (default 422)."""

    def __init__(self, message: str, status_code: int = 422) -> None:
        super().__init__(message)
        self.status_code = status_code


class NotFound(LookupError):
    """Maps to 404."""


class Forbidden(PermissionError):
    """The token may not touch this project. Maps to 403."""


class Conflict(ValueError):
    """The request contradicts stored state (e.g. moving a run to another project). 409."""


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def as_utc(value: datetime) -> datetime:
    return (
        value.replace(tzinfo=timezone.utc)
        if value.tzinfo is None
        else value.astimezone(timezone.utc)
    )


def check_run_uid(run_uid: str) -> str:
    if not RUN_UID_RE.match(run_uid):
        raise BadInput(
            f"run id {run_uid[:80]!r} is not valid: use 1-64 characters from A-Z a-z 0-9 _ . - "
            "(the client generates a uuid4 hex)"
        )
    return run_uid


# --- projects, tasks, runs -------------------------------------------------------------------


def _insert_ignore(conn: Connection, table: Any, values: Mapping[str, Any], keys: list[str]) -> int:
    """Portable INSERT ... ON CONFLICT DO NOTHING (race-safe get-or-create)."""
    dialect = conn.dialect.name
    stmt: Executable
    if dialect == "postgresql":
        stmt = pg.insert(table).values(**values).on_conflict_do_nothing(index_elements=keys)
    elif dialect == "sqlite":
        stmt = sqlite.insert(table).values(**values).on_conflict_do_nothing(index_elements=keys)
    else:  # pragma: no cover - only SQLite and PostgreSQL are supported
        raise NotImplementedError(dialect)
    return int(conn.execute(stmt, execution_options={"preserve_rowcount": True}).rowcount)


def get_or_create_project(conn: Connection, name: str) -> int:
    _insert_ignore(conn, Project, {"name": name, "created_at": utcnow()}, ["name"])
    return int(conn.execute(select(Project.id).where(Project.name == name)).scalar_one())


def get_or_create_task(conn: Connection, project_id: int, name: str) -> int:
    _insert_ignore(conn, Task, {"project_id": project_id, "name": name}, ["project_id", "name"])
    return int(
        conn.execute(
            select(Task.id).where(Task.project_id == project_id, Task.name == name)
        ).scalar_one()
    )


@dataclass(frozen=True)
class RunIn:
    """A validated PUT /runs/{uid} body (see ``api.schemas.RunPut``)."""

    project: str
    task: str
    name: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)
    batch_size: float | None = None
    units: str = "examples"
    status: str = "running"
    started_at: datetime | None = None


@dataclass(frozen=True)
class RunRef:
    id: int
    uid: str
    project_id: int
    project: str


def _lock_run(conn: Connection, run_uid: str) -> RunRef | None:
    """Find a run and, on PostgreSQL, lock its row for this transaction.

    Concurrent ingests into the same run then serialise (needed for exact ``sample_block``
    sums); different runs never wait for each other. Every write transaction locks at most one
    run row, so there is no lock-order cycle and no deadlock. SQLite already serialises writers
    through ``BEGIN IMMEDIATE``.
    """
    stmt = (
        select(Run.id, Run.uid, Run.project_id, Project.name)
        .join(Project, Project.id == Run.project_id)
        .where(Run.uid == run_uid)
    )
    if conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update(key_share=True, of=Run)
    row = conn.execute(stmt).first()
    return None if row is None else RunRef(int(row[0]), str(row[1]), int(row[2]), str(row[3]))


def _require_run(conn: Connection, run_uid: str, project_scope: int | None) -> RunRef:
    run = _lock_run(conn, check_run_uid(run_uid))
    if run is None:
        raise NotFound(
            f"run {run_uid!r} does not exist: create it first with PUT {_wire.runs_path(run_uid)}"
        )
    if project_scope is not None and run.project_id != project_scope:
        raise Forbidden(f"this token does not grant access to the project of run {run_uid!r}")
    return run


def upsert_run(
    engine: Engine, run_uid: str, run: RunIn, *, project_scope: int | None = None
) -> tuple[RunRef, bool]:
    """Create or update a run by its client-generated uid; returns (run, created).

    Idempotent: a retried PUT updates the same row. A run never moves to another project.
    ``started_at`` keeps its first value (a resumed client may re-send a later one).
    """
    check_run_uid(run_uid)
    with write_transaction(engine) as conn:
        project_id = get_or_create_project(conn, run.project)
        if project_scope is not None and project_id != project_scope:
            raise Forbidden(f"this token does not grant access to project {run.project!r}")
        task_id = get_or_create_task(conn, project_id, run.task)
        existing = _lock_run(conn, run_uid)
        values: dict[str, Any] = {
            "task_id": task_id,
            "name": run.name,
            "config": run.config,
            "tags": run.tags,
            "batch_size": run.batch_size,
            "units": run.units,
            "status": run.status,
            "last_seen_at": utcnow(),
        }
        if existing is None:
            values |= {
                "uid": run_uid,
                "project_id": project_id,
                "started_at": as_utc(run.started_at) if run.started_at else utcnow(),
            }
            created = _insert_ignore(conn, Run, values, ["uid"]) == 1
            ref = _lock_run(conn, run_uid)
            assert ref is not None
            if ref.project_id != project_id:  # lost a creation race to another project's PUT
                raise Conflict(f"run {run_uid!r} already belongs to project {ref.project!r}")
            if not created:  # lost a creation race to a concurrent PUT of the same run
                conn.execute(update(Run).where(Run.id == ref.id).values(**values))
            return ref, created
        if existing.project_id != project_id:
            raise Conflict(
                f"run {run_uid!r} already belongs to project {existing.project!r}; "
                "a run cannot move to another project (use a new run id)"
            )
        conn.execute(update(Run).where(Run.id == existing.id).values(**values))
        return existing, False


def patch_run(
    engine: Engine,
    run_uid: str,
    *,
    status: str | None = None,
    ended_at: datetime | None = None,
    batch_size: float | None = None,
    project_scope: int | None = None,
) -> RunRef:
    """Update a run's status (finished runs get ``ended_at`` = now unless given)."""
    with write_transaction(engine) as conn:
        run = _require_run(conn, run_uid, project_scope)
        values: dict[str, Any] = {"last_seen_at": utcnow()}
        if status is not None:
            values["status"] = status
            if status != "running" and ended_at is None:
                ended_at = utcnow()
        if ended_at is not None:
            values["ended_at"] = as_utc(ended_at)
        if batch_size is not None:
            values["batch_size"] = batch_size
        conn.execute(update(Run).where(Run.id == run.id).values(**values))
        return run


# --- samples -----------------------------------------------------------------------------------

_INT_COLUMNS = ("seq", "step")
_FLOAT_COLUMNS = ("examples", "b_small", "b_big", "g_small_sq", "g_big_sq", "loss", "lr", "time")
_NUMBER_TYPES = frozenset({int, float})
_NULLABLE_NUMBER_TYPES = frozenset({int, float, type(None)})


@dataclass(frozen=True)
class SampleBatch:
    """Validated columns, each a list of length ``n``, plus the per-sample estimates."""

    n: int
    columns: dict[str, list[Any]]
    g_sq_est: list[float]
    trace_sigma_est: list[float]


def _first_bad(values: Sequence[Any], ok: Any) -> int:
    return next(i for i, v in enumerate(values) if not ok(v))


def _is_finite(v: Any) -> bool:
    try:
        return v is None or math.isfinite(v)
    except OverflowError:  # an int too large for a double
        return False


def _check_finite(name: str, col: list[Any], values: list[Any]) -> None:
    """One ``sum`` proves a whole column finite (any inf/nan makes the sum non-finite)."""
    if _is_finite(sum(values) if values else 0.0):
        return
    bad = [i for i, v in enumerate(col) if not _is_finite(v)]
    if bad:  # else: finite values whose sum merely overflowed
        raise BadInput(
            f"column {name!r}[{bad[0]}] must be a finite number, got {col[bad[0]]!r:.40}"
        )


def validate_samples(
    payload: Any, *, max_samples: int = _wire.MAX_SAMPLES_PER_REQUEST
) -> SampleBatch:
    """Check a ``{"columns": {...}}`` body column by column; raise BadInput naming the problem.

    Whole-column checks (``set(map(type, col))``, ``math.fsum``-free ``sum`` for finiteness)
    keep this at a few hundred nanoseconds per sample; the slow per-element scan runs only to
    locate the first bad element for the error message.
    """
    if not isinstance(payload, dict) or not isinstance(payload.get("columns"), dict):
        raise BadInput('body must be a JSON object {"columns": {"seq": [...], "step": [...], ...}}')
    columns: dict[str, Any] = payload["columns"]
    unknown = sorted(set(columns) - set(_wire.SAMPLE_COLUMNS))
    if unknown:
        raise BadInput(
            f"unknown column(s) {', '.join(map(repr, unknown))}; "
            f"expected {', '.join(_wire.SAMPLE_COLUMNS)}"
        )
    missing = [c for c in _wire.REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise BadInput(f"missing required column(s): {', '.join(missing)}")
    for name, col in columns.items():
        if not isinstance(col, list):
            raise BadInput(f"column {name!r} must be a JSON array, got {type(col).__name__}")
    n = len(columns["seq"])
    if n > max_samples:
        raise BadInput(
            f"too many samples in one request: {n} > {max_samples}; split the batch", 413
        )
    for name, col in columns.items():
        if len(col) != n:
            raise BadInput(
                f"column {name!r} has {len(col)} values but 'seq' has {n}; "
                "all columns must have the same length"
            )
    out: dict[str, list[Any]] = {}
    for name in _INT_COLUMNS:
        col = columns[name]
        if n and set(map(type, col)) != {int}:
            i = _first_bad(col, lambda v: type(v) is int)
            raise BadInput(f"column {name!r}[{i}] must be an integer, got {col[i]!r:.40}")
        if n and (min(col) < 0 or max(col) > _INT64_MAX):
            i = _first_bad(col, lambda v: 0 <= v <= _INT64_MAX)
            raise BadInput(f"column {name!r}[{i}] = {col[i]} is out of range [0, 2^63-1]")
        out[name] = col
    for name in _FLOAT_COLUMNS:
        col = columns.get(name)
        nullable = name in _wire.NULLABLE_COLUMNS
        if col is None:
            out[name] = [None] * n
            continue
        allowed = _NULLABLE_NUMBER_TYPES if nullable else _NUMBER_TYPES
        kinds = set(map(type, col))
        if not kinds <= allowed:
            i = _first_bad(col, lambda v, ok=allowed: type(v) in ok)
            what = "a number or null" if nullable else "a number"
            raise BadInput(f"column {name!r}[{i}] must be {what}, got {col[i]!r:.40}")
        values = [v for v in col if v is not None] if type(None) in kinds else col
        _check_finite(name, col, values)
        out[name] = col
    series = columns.get("series")
    if series is None:
        out["series"] = [""] * n
    else:
        if n and set(map(type, series)) != {str}:
            i = _first_bad(series, lambda v: type(v) is str)
            raise BadInput(f"column 'series'[{i}] must be a string, got {series[i]!r:.40}")
        if n and max(map(len, series)) > _wire.MAX_NAME_LENGTH:
            i = _first_bad(series, lambda v: len(v) <= _wire.MAX_NAME_LENGTH)
            raise BadInput(
                f"column 'series'[{i}] is longer than {_wire.MAX_NAME_LENGTH} characters"
            )
        if n and "\x00" in "".join(series):  # PostgreSQL text cannot hold U+0000
            i = _first_bad(series, lambda v: "\x00" not in v)
            raise BadInput(f"column 'series'[{i}] must not contain NUL (U+0000) characters")
        out["series"] = series
    b_small, b_big = out["b_small"], out["b_big"]
    # Batch sizes rarely change within a request: check each distinct pair once.
    pairs = set(zip(b_small, b_big, strict=True)) if n else set()
    if not all(_batch_sizes_ok(bs, bb) for bs, bb in pairs):
        i = next(i for i in range(n) if not _batch_sizes_ok(b_small[i], b_big[i]))
        raise BadInput(
            f"sample {i}: need 0 < b_small < b_big, got b_small={b_small[i]}, b_big={b_big[i]} "
            "(the two batch sizes of the two-batch estimator must differ)"
        )
    for name in ("g_small_sq", "g_big_sq"):
        col = out[name]
        if n and min(col) < 0:
            i = _first_bad(col, lambda v: v >= 0)
            raise BadInput(f"column {name!r}[{i}] = {col[i]} is negative; squared norms are >= 0")
    estimates = list(map(two_batch_estimates, b_small, b_big, out["g_small_sq"], out["g_big_sq"]))
    g_sq_est = [e[0] for e in estimates]
    trace_sigma_est = [e[1] for e in estimates]
    if not (math.isfinite(sum(g_sq_est)) and math.isfinite(sum(trace_sigma_est))):
        raise BadInput("the squared norms are too large: the |G|^2 or tr(Sigma) estimate overflows")
    return SampleBatch(n, out, g_sq_est, trace_sigma_est)


def _batch_sizes_ok(b_small: float, b_big: float) -> bool:
    return b_big > b_small > 0


_SAMPLE_INSERT_COLUMNS = ("run_id", *SAMPLE_COLUMNS)
_SQLITE_SAMPLE_INSERT = str(
    sqlite.insert(Sample)
    .values(dict.fromkeys(_SAMPLE_INSERT_COLUMNS))
    .on_conflict_do_nothing(index_elements=["run_id", "seq"])
    .compile(dialect=sqlite.dialect())
)


def _pg_sample_insert() -> Executable:
    """INSERT ... SELECT FROM unnest(<one array per column>) ON CONFLICT DO NOTHING.

    One statement with 14 array parameters per chunk: no per-row parameter limit and far fewer
    round trips than executemany.
    """
    from sqlalchemy import bindparam

    types: dict[str, Any] = {
        "run_id": BigInteger,
        "seq": BigInteger,
        "step": BigInteger,
        "series": String,
    }
    arrays = [bindparam(c, type_=ARRAY(types.get(c, Double))) for c in _SAMPLE_INSERT_COLUMNS]
    unnest = func.unnest(*arrays).table_valued(*_SAMPLE_INSERT_COLUMNS).render_derived()
    return (
        pg.insert(Sample)
        .from_select(list(_SAMPLE_INSERT_COLUMNS), select(*unnest.c))
        .on_conflict_do_nothing(index_elements=["run_id", "seq"])
    )


def _pg_binary_sql(stmt: Executable) -> str:
    """The statement's psycopg SQL with binary array parameters (``%(x)b``): psycopg dumps a
    Python list of floats as a binary array ~3x faster than as text."""
    sql = str(stmt.compile(dialect=pg.psycopg.dialect()))  # type: ignore[attr-defined,no-untyped-call]
    binary = re.sub(r"%\((\w+)\)s::", r"%(\1)b::", sql)
    assert binary.count(")b::") == len(_SAMPLE_INSERT_COLUMNS), binary
    return binary


_PG_SAMPLE_INSERT = _pg_binary_sql(_pg_sample_insert())


def _as_float(col: Iterable[Any]) -> list[float | None]:
    return [None if v is None else float(v) for v in col]


def _insert_samples(conn: Connection, run_id: int, batch: SampleBatch) -> int:
    cols = batch.columns
    inserted = 0
    if conn.dialect.name == "sqlite":
        rows = list(
            zip(
                repeat(run_id, batch.n),
                cols["seq"],
                cols["step"],
                cols["examples"],
                cols["b_small"],
                cols["b_big"],
                cols["g_small_sq"],
                cols["g_big_sq"],
                batch.g_sq_est,
                batch.trace_sigma_est,
                cols["loss"],
                cols["lr"],
                cols["time"],
                cols["series"],
                strict=True,
            )
        )
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            for start in range(0, len(rows), CHUNK_ROWS):
                cursor.executemany(_SQLITE_SAMPLE_INSERT, rows[start : start + CHUNK_ROWS])
                inserted += max(cursor.rowcount, 0)
        finally:
            cursor.close()
        return inserted
    arrays: dict[str, list[Any]] = {
        "seq": cols["seq"],
        "step": cols["step"],
        "series": cols["series"],
        "g_sq_est": batch.g_sq_est,
        "trace_sigma_est": batch.trace_sigma_est,
    }
    for name in _FLOAT_COLUMNS:
        arrays[name] = _as_float(cols[name])  # psycopg needs one element type per array
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        for start in range(0, batch.n, CHUNK_ROWS):
            stop = min(start + CHUNK_ROWS, batch.n)
            params = {name: values[start:stop] for name, values in arrays.items()}
            params["run_id"] = [run_id] * (stop - start)
            cursor.execute(_PG_SAMPLE_INSERT, params)
            inserted += max(cursor.rowcount, 0)
    finally:
        cursor.close()
    return inserted


def _block_ranges(seqs: Iterable[int]) -> list[tuple[int, int]]:
    """Contiguous [first, last] block-index ranges touched by these sequence numbers."""
    blocks = sorted({s // BLOCK_SIZE for s in seqs})
    ranges: list[tuple[int, int]] = []
    for b in blocks:
        if ranges and b == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], b)
        else:
            ranges.append((b, b))
    return ranges


#: SampleBlock's columns after run_id; the per-batch sums (``_block_deltas``) and both
#: block upserts follow this order.
_BLOCK_COLUMNS = (
    "series",
    "block",
    "n",
    "sum_g_sq",
    "sum_trace_sigma",
    "n_loss",
    "sum_loss",
    "n_lr",
    "sum_lr",
    "step_min",
    "step_max",
    "examples_min",
    "examples_max",
    "time_min",
    "time_max",
    "b_big_max",
)


def _block_upsert(dialect_name: str) -> Executable:
    from sqlalchemy import bindparam

    s = Sample
    block = (s.seq // BLOCK_SIZE).label("block")
    source = (
        select(
            s.run_id,
            s.series,
            block,
            func.count().label("n"),
            func.sum(s.g_sq_est),
            func.sum(s.trace_sigma_est),
            func.count(s.loss),
            func.sum(s.loss),
            func.count(s.lr),
            func.sum(s.lr),
            func.min(s.step),
            func.max(s.step),
            func.min(s.examples),
            func.max(s.examples),
            func.min(s.time),
            func.max(s.time),
            func.max(s.b_big),
        )
        .where(
            s.run_id == bindparam("run_id"),
            s.seq >= bindparam("seq_lo"),
            s.seq < bindparam("seq_hi"),
        )
        .group_by(s.run_id, s.series, block)
    )
    target = ["run_id", *_BLOCK_COLUMNS]
    ins = (pg.insert if dialect_name == "postgresql" else sqlite.insert)(SampleBlock)
    stmt = ins.from_select(target, source)
    return stmt.on_conflict_do_update(
        index_elements=["run_id", "series", "block"],
        set_={c: stmt.excluded[c] for c in target[3:]},
    )


_BLOCK_UPSERT = {d: _block_upsert(d) for d in ("sqlite", "postgresql")}


def _refresh_blocks(conn: Connection, run_id: int, seqs: Iterable[int]) -> None:
    """Recompute the touched blocks from ``sample`` (exact and idempotent; see SampleBlock)."""
    stmt = _BLOCK_UPSERT[conn.dialect.name]
    for first, last in _block_ranges(seqs):
        conn.execute(
            stmt,
            {"run_id": run_id, "seq_lo": first * BLOCK_SIZE, "seq_hi": (last + 1) * BLOCK_SIZE},
        )


def ingest_samples(
    engine: Engine, run_uid: str, batch: SampleBatch, *, project_scope: int | None = None
) -> int:
    """Insert-or-ignore a validated batch into a run; returns how many rows were new."""
    with write_transaction(engine) as conn:
        run = _require_run(conn, run_uid, project_scope)
        if batch.n == 0:
            return 0
        inserted = _insert_samples(conn, run.id, batch)
        if inserted:
            deltas = _block_deltas(batch) if inserted == batch.n else None
            if deltas is not None:  # every row was new: add the batch's own sums
                _add_block_deltas(conn, run.id, deltas)
            else:  # some rows were already stored: recompute the touched blocks
                _refresh_blocks(conn, run.id, batch.columns["seq"])
            conn.execute(update(Run).where(Run.id == run.id).values(last_seen_at=utcnow()))
        return inserted


def _nonnull(values: list[Any]) -> list[Any]:
    return [v for v in values if v is not None]


def _block_deltas(batch: SampleBatch) -> list[tuple[Any, ...]] | None:
    """Per-block sums of a batch whose seqs are strictly increasing and share one series.

    That is what clients send (one series per batch is the common case; anything else falls
    back to recomputing from ``sample``). Slices and C-level ``sum``/``min``/``max`` keep this
    well under a microsecond per sample. Rows match ``_BLOCK_COLUMNS``.
    """
    cols = batch.columns
    seq = cols["seq"]
    series = cols["series"]
    if batch.n == 0 or series.count(series[0]) != batch.n:
        return None
    if batch.n > 1 and not all(map(operator.lt, seq, itertools.islice(seq, 1, None))):
        return None
    step, examples, time_ = cols["step"], cols["examples"], cols["time"]
    loss, lr, b_big = cols["loss"], cols["lr"], cols["b_big"]
    g_sq, trace_sigma = batch.g_sq_est, batch.trace_sigma_est
    out: list[tuple[Any, ...]] = []
    i = 0
    while i < batch.n:
        block = seq[i] // BLOCK_SIZE
        j = bisect.bisect_left(seq, (block + 1) * BLOCK_SIZE, i)
        ex = _nonnull(examples[i:j])
        tm = _nonnull(time_[i:j])
        ls = _nonnull(loss[i:j])
        lrs = _nonnull(lr[i:j])
        out.append(
            (
                series[0],
                block,
                j - i,
                math.fsum(g_sq[i:j]),
                math.fsum(trace_sigma[i:j]),
                len(ls),
                math.fsum(ls) if ls else None,
                len(lrs),
                math.fsum(lrs) if lrs else None,
                min(step[i:j]),
                max(step[i:j]),
                min(ex) if ex else None,
                max(ex) if ex else None,
                min(tm) if tm else None,
                max(tm) if tm else None,
                float(max(b_big[i:j])),
            )
        )
        i = j
    return out


def _block_add_sql(dialect_name: str) -> str:
    """INSERT a block's delta, or add it to the stored block (sums add, extremes widen).

    Commutative, so the order of batches does not matter; NULL-safe on both backends (SQLite's
    two-argument min() would return NULL if either side were NULL).
    """
    lo, hi = ("least", "greatest") if dialect_name == "postgresql" else ("min", "max")
    t, e = "sample_block", "excluded"

    def add(c: str) -> str:
        return f"{c} = coalesce({t}.{c}, 0) + coalesce({e}.{c}, 0)"

    def add_nullable(c: str) -> str:
        return (
            f"{c} = CASE WHEN {t}.{c} IS NULL THEN {e}.{c} WHEN {e}.{c} IS NULL THEN {t}.{c} "
            f"ELSE {t}.{c} + {e}.{c} END"
        )

    def widen(c: str, f: str) -> str:
        return f"{c} = {f}(coalesce({t}.{c}, {e}.{c}), coalesce({e}.{c}, {t}.{c}))"

    sets = [
        add("n"),
        add("sum_g_sq"),
        add("sum_trace_sigma"),
        add("n_loss"),
        add_nullable("sum_loss"),
        add("n_lr"),
        add_nullable("sum_lr"),
        widen("step_min", lo),
        widen("step_max", hi),
        widen("examples_min", lo),
        widen("examples_max", hi),
        widen("time_min", lo),
        widen("time_max", hi),
        widen("b_big_max", hi),
    ]
    marks = ", ".join(["?" if dialect_name == "sqlite" else "%s"] * (len(_BLOCK_COLUMNS) + 1))
    return (
        f"INSERT INTO {t} (run_id, {', '.join(_BLOCK_COLUMNS)}) VALUES ({marks}) "
        f"ON CONFLICT (run_id, series, block) DO UPDATE SET {', '.join(sets)}"
    )


_BLOCK_ADD = {d: _block_add_sql(d) for d in ("sqlite", "postgresql")}


def _add_block_deltas(conn: Connection, run_id: int, deltas: list[tuple[Any, ...]]) -> None:
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.executemany(_BLOCK_ADD[conn.dialect.name], [(run_id, *d) for d in deltas])
    finally:
        cursor.close()


# --- events ------------------------------------------------------------------------------------


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
        run = _require_run(conn, run_uid, project_scope)
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
        ins = (pg.insert if conn.dialect.name == "postgresql" else sqlite.insert)(Event)
        inserted = 0
        for e_row in rows:  # few events per request; rowcount per row is portable
            result = conn.execute(
                ins.values(**e_row).on_conflict_do_nothing(),
                execution_options={"preserve_rowcount": True},
            )
            inserted += result.rowcount
        return inserted


# --- tokens ------------------------------------------------------------------------------------

TOKEN_PREFIX = "nsk_"


def hash_token(secret: str) -> str:
    """sha256 hex of a token secret: what is stored and looked up (the secret never is)."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class TokenCreated:
    id: int
    project: str
    name: str
    #: The secret: shown once, never stored.
    secret: str


def create_token(engine: Engine, project: str, name: str = "") -> TokenCreated:
    """Create an API token for ``project`` (created if missing); the secret is returned once."""
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with write_transaction(engine) as conn:
        project_id = get_or_create_project(conn, project)
        token_id = conn.execute(
            insert(Token)
            .values(
                project_id=project_id,
                name=name or f"token-{secrets.token_hex(3)}",
                token_hash=hash_token(secret),
                created_at=utcnow(),
            )
            .returning(Token.id, Token.name)
        ).one()
    return TokenCreated(int(token_id[0]), project, str(token_id[1]), secret)


def revoke_token(engine: Engine, token_id: int, *, project: str | None = None) -> bool:
    """Revoke a token at once (every request looks the hash up; nothing caches it)."""
    with write_transaction(engine) as conn:
        stmt = update(Token).where(Token.id == token_id, Token.revoked_at.is_(None))
        if project is not None:
            stmt = stmt.where(
                Token.project_id
                == select(Project.id).where(Project.name == project).scalar_subquery()
            )
        return bool(conn.execute(stmt.values(revoked_at=utcnow())).rowcount)
