"""The one write path: every row noisescope stores goes through this module.

Each public function runs in ONE transaction (``db.write_transaction``): a request either lands
completely or not at all, so a bad or interrupted request never leaves partial data.

Sample ingest stays thin on purpose (issue 9: >= 50% of the raw driver's executemany rate end to
end): columns are validated as whole arrays (no object per sample), the per-sample unbiased
estimates |𝒢|^2 and 𝒮 (science.md, two-batch estimator) come from ``noisescope.estimators``
(``two_batch_estimate_columns``) so SQL only ever sums them, and rows go to the driver in
multi-row INSERTs of a few hundred rows (SQLite) or one ``unnest`` INSERT per chunk
(PostgreSQL), both insert-or-ignore on (run_id, seq) so a re-sent batch never duplicates.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import math
import re
import secrets
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Connection,
    Double,
    Engine,
    String,
    bindparam,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.dialects import sqlite
from sqlalchemy.sql.expression import Executable

from noisescope import _wire
from noisescope.estimators import two_batch_estimate_columns, two_batch_estimates
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

#: Rows per ``unnest`` INSERT on PostgreSQL: bounds statement size and lock hold time.
CHUNK_ROWS = 5_000
_INT64_MAX = 2**63 - 1


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
    problem = _wire.run_id_problem(run_uid)
    if problem is not None:
        raise BadInput(problem)
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
    row = conn.execute(_LOCK_RUN[conn.dialect.name], {"run_uid": run_uid}).first()
    return None if row is None else RunRef(int(row[0]), str(row[1]), int(row[2]), str(row[3]))


def _lock_run_stmt(dialect_name: str) -> Executable:
    stmt = (
        select(Run.id, Run.uid, Run.project_id, Project.name)
        .join(Project, Project.id == Run.project_id)
        .where(Run.uid == bindparam("run_uid"))
    )
    if dialect_name == "postgresql":
        stmt = stmt.with_for_update(key_share=True, of=Run)
    return stmt


# Built once: building a statement costs more than running it on the per-request path.
_LOCK_RUN = {d: _lock_run_stmt(d) for d in ("sqlite", "postgresql")}
_TOUCH_RUN = update(Run).where(Run.id == bindparam("run_id")).values(last_seen_at=bindparam("now"))


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
#: Float columns that clients send in order (their order lets block extremes be the ends).
_ORDERED_FLOAT_COLUMNS = frozenset({"examples", "time"})
#: Float columns that usually hold one value per request (checked once when they do).
_USUALLY_UNIFORM_COLUMNS = frozenset({"b_small", "b_big", "lr"})
_NUMBER_TYPES = frozenset({int, float})
_NULLABLE_NUMBER_TYPES = frozenset({int, float, type(None)})


@dataclass(frozen=True)
class SampleBatch:
    """Validated columns, each a list of length ``n``, plus the per-sample estimates.

    Also what validation learnt on the way, so the block sums need not scan again:
    ``null_columns`` hold at least one null; ``uniform_columns`` hold one value throughout and
    ``ascending_columns`` are in non-decreasing order (only some columns are looked at: seq,
    step, examples and time for order; series, the batch sizes and lr for uniformity).
    """

    n: int
    columns: dict[str, list[Any]]
    g_sq_est: list[float]
    trace_sigma_est: list[float]
    null_columns: frozenset[str]
    uniform_columns: frozenset[str]
    ascending_columns: frozenset[str]


def _first_bad(values: Sequence[Any], ok: Any) -> int:
    return next(i for i, v in enumerate(values) if not ok(v))


def _is_finite(v: Any) -> bool:
    try:
        return v is None or math.isfinite(v)
    except OverflowError:  # an int too large for a double
        return False


def _is_uniform_number(col: list[Any]) -> bool:
    """Whether all elements equal the first, a number (later checks still vet its type)."""
    return type(col[0]) in _NUMBER_TYPES and col.count(col[0]) == len(col)


def _only_numbers_equal(value: Any) -> bool:
    """Whether ``value`` is a finite number other than 0 and 1.

    Elements equal to such a value are finite numbers too (no bool, null or string equals it),
    so a column of them needs no type or finiteness scan.
    """
    return type(value) in _NUMBER_TYPES and _is_finite(value) and value not in (0, 1)


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

    Whole-column checks in C keep this at a few hundred nanoseconds per sample:
    ``set(map(type, col))`` for types, ``sum`` for finiteness, ``col == sorted(col)`` for
    order (then the ends are the extremes), ``list.count`` for columns that hold one value
    (series, batch sizes and lr, usually), which are then checked once. The slow per-element scan
    runs only to locate the first bad element for the error message.
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
    null_columns: set[str] = set()
    uniform_columns: set[str] = set()
    ascending_columns: set[str] = set()
    for name in _INT_COLUMNS:
        col = columns[name]
        if not n:
            out[name] = col
            continue
        if set(map(type, col)) != {int}:
            i = _first_bad(col, lambda v: type(v) is int)
            raise BadInput(f"column {name!r}[{i}] must be an integer, got {col[i]!r:.40}")
        if col == sorted(col):  # the usual order: then the ends are the extremes
            ascending_columns.add(name)
            lowest, highest = col[0], col[-1]
        else:
            lowest, highest = min(col), max(col)
        if lowest < 0 or highest > _INT64_MAX:
            i = _first_bad(col, lambda v: 0 <= v <= _INT64_MAX)
            raise BadInput(f"column {name!r}[{i}] = {col[i]} is out of range [0, 2^63-1]")
        out[name] = col
    for name in _FLOAT_COLUMNS:
        col = columns.get(name)
        nullable = name in _wire.NULLABLE_COLUMNS
        if col is None:
            out[name] = [None] * n
            if n:
                null_columns.add(name)
            continue
        if name in _USUALLY_UNIFORM_COLUMNS and n and _is_uniform_number(col):
            uniform_columns.add(name)
            if _only_numbers_equal(col[0]):  # then every element is a number equal to it
                out[name] = col
                continue
        allowed = _NULLABLE_NUMBER_TYPES if nullable else _NUMBER_TYPES
        kinds = set(map(type, col))
        if not kinds <= allowed:
            i = _first_bad(col, lambda v, ok=allowed: type(v) in ok)
            what = "a number or null" if nullable else "a number"
            raise BadInput(f"column {name!r}[{i}] must be {what}, got {col[i]!r:.40}")
        if type(None) in kinds:
            null_columns.add(name)
            values = [v for v in col if v is not None]
        else:
            values = col
        _check_finite(name, col, values)
        if name in _ORDERED_FLOAT_COLUMNS and values is col and col == sorted(col):
            ascending_columns.add(name)
        out[name] = col
    series = columns.get("series")
    if series is None:
        out["series"] = [""] * n
        uniform_columns.add("series")
    else:
        # One series per request is the usual case: then check its one value only.
        if n and type(series[0]) is str and series.count(series[0]) == n:
            uniform_columns.add("series")
            checked = series[:1]
        else:
            checked = series
        if n and set(map(type, checked)) != {str}:
            i = _first_bad(series, lambda v: type(v) is str)
            raise BadInput(f"column 'series'[{i}] must be a string, got {series[i]!r:.40}")
        if n and max(map(len, checked)) > _wire.MAX_NAME_LENGTH:
            i = _first_bad(series, lambda v: len(v) <= _wire.MAX_NAME_LENGTH)
            raise BadInput(
                f"column 'series'[{i}] is longer than {_wire.MAX_NAME_LENGTH} characters"
            )
        if n and "\x00" in "".join(checked):  # PostgreSQL text cannot hold U+0000
            i = _first_bad(series, lambda v: "\x00" not in v)
            raise BadInput(f"column 'series'[{i}] must not contain NUL (U+0000) characters")
        out["series"] = series
    b_small, b_big = out["b_small"], out["b_big"]
    # Batch sizes rarely change within a request: check each distinct pair once.
    one_pair = n > 0 and {"b_small", "b_big"} <= uniform_columns
    pairs = {(b_small[0], b_big[0])} if one_pair else set(zip(b_small, b_big, strict=True))
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
    if one_pair:
        g_sq_est, trace_sigma_est = two_batch_estimate_columns(
            b_small[0], b_big[0], out["g_small_sq"], out["g_big_sq"]
        )
    else:
        pair_estimates = list(
            map(two_batch_estimates, b_small, b_big, out["g_small_sq"], out["g_big_sq"])
        )
        g_sq_est = [e[0] for e in pair_estimates]
        trace_sigma_est = [e[1] for e in pair_estimates]
    if not (math.isfinite(sum(g_sq_est)) and math.isfinite(sum(trace_sigma_est))):
        raise BadInput("the squared norms are too large: the |G|^2 or tr(Sigma) estimate overflows")
    return SampleBatch(
        n,
        out,
        g_sq_est,
        trace_sigma_est,
        frozenset(null_columns),
        frozenset(uniform_columns),
        frozenset(ascending_columns),
    )


def _batch_sizes_ok(b_small: float, b_big: float) -> bool:
    return b_big > b_small > 0


_SAMPLE_INSERT_COLUMNS = ("run_id", *SAMPLE_COLUMNS)
_SQLITE_SAMPLE_INSERT = str(
    sqlite.insert(Sample)
    .values(dict.fromkeys(_SAMPLE_INSERT_COLUMNS))
    .on_conflict_do_nothing(index_elements=["run_id", "seq"])
    .compile(dialect=sqlite.dialect())
)
#: Rows per multi-row INSERT on SQLite (14 parameters each; SQLite allows 32766 since 3.32).
SQLITE_ROWS_PER_INSERT = 500


@functools.lru_cache(maxsize=16)
def _sqlite_sample_insert(rows: int) -> str:
    """The insert-or-ignore for ``rows`` rows in one statement: ``VALUES (?, ...), (?, ...)``.

    One statement per few hundred rows instead of ``executemany``'s one per row: SQLite runs
    the VALUES list in one step (about a third less CPU per row, and the GIL is released for
    the whole step rather than re-taken after every row), and the parameters are one flat list
    interleaved by slice assignment, with no tuple per row.
    """
    one_row = "(" + ", ".join(["?"] * len(_SAMPLE_INSERT_COLUMNS)) + ")"
    head, values, tail = _SQLITE_SAMPLE_INSERT.partition(f" VALUES {one_row}")
    assert values, _SQLITE_SAMPLE_INSERT
    return f"{head} VALUES {', '.join([one_row] * rows)}{tail}"


def _sqlite_rows_per_insert(dbapi_connection: Any) -> int:
    """SQLITE_ROWS_PER_INSERT, or fewer where this SQLite allows fewer parameters."""
    getlimit = getattr(dbapi_connection, "getlimit", None)  # Python >= 3.11
    if getlimit is not None:
        limit = int(getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER))
    else:
        limit = 32_766 if sqlite3.sqlite_version_info >= (3, 32, 0) else 999
    return max(1, min(SQLITE_ROWS_PER_INSERT, limit // len(_SAMPLE_INSERT_COLUMNS)))


def _pg_sample_insert() -> Executable:
    """INSERT ... SELECT FROM unnest(<one array per column>) ON CONFLICT DO NOTHING.

    One statement with 14 array parameters per chunk: no per-row parameter limit and far fewer
    round trips than executemany.
    """
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
        stored = {**cols, "g_sq_est": batch.g_sq_est, "trace_sigma_est": batch.trace_sigma_est}
        columns = [stored[name] for name in SAMPLE_COLUMNS]
        width = len(_SAMPLE_INSERT_COLUMNS)
        dbapi_connection = conn.connection.dbapi_connection
        per_insert = _sqlite_rows_per_insert(dbapi_connection)
        cursor = dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            for start in range(0, batch.n, per_insert):
                rows = min(per_insert, batch.n - start)
                flat: list[Any] = [run_id] * (width * rows)  # run_id at 0, 14, 28, ...
                for offset, values in enumerate(columns, start=1):
                    flat[offset::width] = values[start : start + rows]
                cursor.execute(_sqlite_sample_insert(rows), flat)
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
            conn.execute(_TOUCH_RUN, {"run_id": run.id, "now": utcnow()})
        return inserted


def _nonnull(values: list[Any]) -> list[Any]:
    return [v for v in values if v is not None]


def _block_deltas(batch: SampleBatch) -> list[tuple[Any, ...]] | None:
    """Per-block sums of a batch whose seqs are ascending and share one series.

    Only for a batch whose rows were all new (hence distinct seqs: ascending is then strictly
    increasing). That is what clients send (one series per batch is the common case; anything
    else falls back to recomputing from ``sample``). Slices and C-level ``math.fsum``/``min``/
    ``max`` keep this well under a microsecond per sample, and what validation found (no nulls,
    ascending, one value) skips the null filter or gives a block's extremes from its ends.
    Rows match ``_BLOCK_COLUMNS``.
    """
    cols = batch.columns
    seq, series, n = cols["seq"], cols["series"], batch.n
    if n == 0 or "seq" not in batch.ascending_columns or "series" not in batch.uniform_columns:
        return None
    nulls, ascending = batch.null_columns, batch.ascending_columns

    def nonnull(name: str, i: int, j: int) -> list[Any]:
        values = cols[name][i:j]
        return _nonnull(values) if name in nulls else values

    def extremes(name: str, values: list[Any]) -> tuple[Any, Any]:
        if not values:
            return None, None
        if name in ascending:
            return values[0], values[-1]
        return min(values), max(values)

    def total(name: str, i: int, j: int) -> tuple[int, float | None]:
        """Count and exact sum of the non-null values; k equal values x sum to k*x (one
        rounding, as math.fsum's)."""
        if name in uniform:
            return j - i, (j - i) * float(cols[name][0])
        values = nonnull(name, i, j)
        return len(values), math.fsum(values) if values else None

    uniform = batch.uniform_columns
    b_big = cols["b_big"]
    b_big_max = float(b_big[0]) if "b_big" in uniform else None
    g_sq, trace_sigma = batch.g_sq_est, batch.trace_sigma_est
    out: list[tuple[Any, ...]] = []
    i = 0
    while i < n:
        block = seq[i] // BLOCK_SIZE
        j = bisect.bisect_left(seq, (block + 1) * BLOCK_SIZE, i)
        out.append(
            (
                series[0],
                block,
                j - i,
                math.fsum(g_sq[i:j]),
                math.fsum(trace_sigma[i:j]),
                *total("loss", i, j),
                *total("lr", i, j),
                *extremes("step", cols["step"][i:j]),
                *extremes("examples", nonnull("examples", i, j)),
                *extremes("time", nonnull("time", i, j)),
                float(max(b_big[i:j])) if b_big_max is None else b_big_max,
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
