"""SQLAlchemy 2 models. The schema itself is owned by Alembic (``migrations/``).

A sample row stores only what was sent: its per-sample unbiased estimates |𝒢|^2 and 𝒮 are a
function of four of its columns (``noisescope.estimators``), derived in Python where a sample is
read (``queries._samples``) and summed in Python into ``sample_block`` at ingest, so the formula
exists in one place and SQL only ever sums block sums. A series name is stored once per run
(``Series``); samples, blocks and chunks carry its number.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeEngine

from noisescope import protocol

# SQLite only auto-increments an INTEGER PRIMARY KEY, not a BIGINT one.
BigIntPK = BigInteger().with_variant(Integer(), "sqlite")

#: Samples per pre-aggregated block: ``sample_block`` holds sums over ``seq // BLOCK_SIZE``.
BLOCK_SIZE = 64

#: Deterministic constraint names, so Alembic can drop/alter them on every backend.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Project(Base):
    __tablename__ = "project"

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Task(Base):
    __tablename__ = "task"
    __table_args__ = (UniqueConstraint("project_id", "name", name="uq_task_project_name"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("project.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))


class Run(Base):
    __tablename__ = "run"
    __table_args__ = (
        Index("ix_run_project_task", "project_id", "task_id"),
        Index("ix_run_started_at", "started_at"),
        Index("ix_run_parent_uid", "parent_uid"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    #: The client-generated id (uuid4 hex): makes run creation idempotent across retries.
    uid: Mapped[str] = mapped_column(String(64), unique=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("project.id", ondelete="CASCADE"))
    task_id: Mapped[int] = mapped_column(ForeignKey("task.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    tags: Mapped[list[str]] = mapped_column(JSON, default=list)
    batch_size: Mapped[float | None] = mapped_column(Double)
    units: Mapped[str] = mapped_column(String(16), default="examples")
    status: Mapped[str] = mapped_column(String(16), default="running")
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_seen_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: A branch run (``noisescope.branch``): its parent's uid and the parent step it started at.
    parent_uid: Mapped[str | None] = mapped_column(String(64))
    branch_step: Mapped[int | None] = mapped_column(BigInteger)
    #: When the run was archived (null: not archived): reads leave it out unless asked, and
    #: restoring it clears this; its rows stay, and a live job still writes to it.
    archived_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: The fields a person changed on the server (PATCH ``name``/``tags``; null: none): a job's
    #: later or replayed PUT keeps them (the change made on the server wins).
    edited: Mapped[list[str] | None] = mapped_column(JSON)


class DeletedRun(Base):
    """A run id that was deleted (DELETE /runs/{id}): writes to it answer 410 Gone, so a job
    that is still running, or a spool synced later, cannot bring the run back partial. A PUT
    with ``?reuse_deleted=true`` (the ``manage`` scope) forgets the row and reuses the id."""

    __tablename__ = "deleted_run"

    uid: Mapped[str] = mapped_column(String(64), primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("project.id", ondelete="CASCADE"))
    deleted_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


#: The column that stores a sample's ``series`` (the field table's one str field): its number
#: in the run's ``series`` table.
SERIES_COLUMN: Final = "series_id"
#: The whole-model series (name ""): number 0 in every run, so the reads of it need no lookup.
WHOLE_MODEL: Final = 0
#: A sample's stored columns after ``run_id``, in table order: the wire columns of the field
#: table (``protocol.STORED_COLUMNS``), the series as its number. The insert path follows it.
SAMPLE_COLUMNS: Final = tuple(
    SERIES_COLUMN if c == "series" else c for c in protocol.STORED_COLUMNS
)


class Series(Base):
    """A run's series names, each stored once: ``sample``, ``sample_block`` and
    ``sample_chunk`` carry the number (``series_id``, unique per run). The whole model's ""
    is ``WHOLE_MODEL``; a layer's name gets the next number when its first sample comes. No
    foreign key from the sample tables: ingest inserts the name in the transaction that
    inserts its samples, and only deleting the run removes it (as the sample rows)."""

    __tablename__ = "series"
    __table_args__ = (UniqueConstraint("run_id", "name", name="uq_series_run_name"),)

    run_id: Mapped[int] = mapped_column(ForeignKey("run.id", ondelete="CASCADE"), primary_key=True)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    name: Mapped[str] = mapped_column(String(200))


class Sample(Base):
    """One measurement. Clustered on (run_id, seq) (SQLite ``WITHOUT ROWID``): ingest appends
    in key order, per-run scans are range reads, and there is no second index to maintain on
    the hot write path; series queries read ``sample_block`` instead."""

    __tablename__ = "sample"
    __table_args__ = ({"sqlite_with_rowid": False},)

    run_id: Mapped[int] = mapped_column(ForeignKey("run.id", ondelete="CASCADE"), primary_key=True)
    #: Per-run sequence number assigned by the client; (run_id, seq) makes ingest idempotent.
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    step: Mapped[int] = mapped_column(BigInteger)
    examples: Mapped[float | None] = mapped_column(Double)
    b_small: Mapped[float] = mapped_column(Double)
    b_big: Mapped[float] = mapped_column(Double)
    g_small_sq: Mapped[float] = mapped_column(Double)
    g_big_sq: Mapped[float] = mapped_column(Double)
    loss: Mapped[float | None] = mapped_column(Double)
    lr: Mapped[float | None] = mapped_column(Double)
    time: Mapped[float | None] = mapped_column(Double)
    #: The series' number in the run (``Series``).
    series_id: Mapped[int] = mapped_column(Integer, default=WHOLE_MODEL)


class SampleBlock(Base):
    """Exact sums over the samples of one run and series with ``seq // BLOCK_SIZE == block``.

    Maintained in the ingest transaction (recomputed from ``sample`` for the touched blocks,
    in Python with the estimators' expressions, so re-sends and out-of-order batches stay
    exact). Series queries on long runs sum blocks
    instead of samples: a 1M-sample run is ~16k block rows. All columns are sums, counts,
    minima or maxima, so any union of blocks is again exact (docs/science.md: ratio taken last).
    """

    __tablename__ = "sample_block"
    __table_args__ = ({"sqlite_with_rowid": False},)

    run_id: Mapped[int] = mapped_column(ForeignKey("run.id", ondelete="CASCADE"), primary_key=True)
    series_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    block: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    n: Mapped[int] = mapped_column(BigInteger)
    sum_g_sq: Mapped[float] = mapped_column(Double)
    sum_trace_sigma: Mapped[float] = mapped_column(Double)
    n_loss: Mapped[int] = mapped_column(BigInteger)
    sum_loss: Mapped[float | None] = mapped_column(Double)
    n_lr: Mapped[int] = mapped_column(BigInteger)
    sum_lr: Mapped[float | None] = mapped_column(Double)
    step_min: Mapped[int] = mapped_column(BigInteger)
    step_max: Mapped[int] = mapped_column(BigInteger)
    examples_min: Mapped[float | None] = mapped_column(Double)
    examples_max: Mapped[float | None] = mapped_column(Double)
    time_min: Mapped[float | None] = mapped_column(Double)
    time_max: Mapped[float | None] = mapped_column(Double)
    b_big_max: Mapped[float] = mapped_column(Double)


class SampleChunk(Base):
    """Up to ``chunks.CHUNK_ROWS`` consecutive samples of one (run, series), compressed
    (``noisescope_server.chunks``): a finished run's samples after compaction
    (``crud.compact_run``). A sample is either a ``sample`` row or in one chunk, never both;
    ``sample_block`` keeps its sums either way. Readers merge rows and chunks by seq
    (``queries._samples``, the one read seam)."""

    __tablename__ = "sample_chunk"
    __table_args__ = ({"sqlite_with_rowid": False},)

    run_id: Mapped[int] = mapped_column(ForeignKey("run.id", ondelete="CASCADE"), primary_key=True)
    series_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    seq_first: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    seq_last: Mapped[int] = mapped_column(BigInteger)
    n: Mapped[int] = mapped_column(BigInteger)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class RunDigest(Base):
    """What a run list computes per run from its samples (the current B_simple window and the
    last loss), stored when the run is compacted (``crud.compact_run``), so that lists of
    thousands of finished runs read one row per run instead of each run's samples. Valid only
    while the run still has ``n_samples`` whole-model samples and ``n_all`` in all (samples
    are never removed, so more of either means a later sample came): readers check both."""

    __tablename__ = "run_digest"

    run_id: Mapped[int] = mapped_column(ForeignKey("run.id", ondelete="CASCADE"), primary_key=True)
    n_samples: Mapped[int] = mapped_column(BigInteger)
    n_all: Mapped[int] = mapped_column(BigInteger)
    #: ``queries.CurrentFields`` as JSON text (Python's ``json``: infinities survive).
    current: Mapped[str] = mapped_column(Text)
    last_loss: Mapped[float | None] = mapped_column(Double)


class Event(Base):
    __tablename__ = "event"
    __table_args__ = (
        Index("ix_event_run_step", "run_id", "step"),
        #: Optional client sequence number: re-sent events are ignored (NULLs never collide).
        UniqueConstraint("run_id", "seq", name="uq_event_run_seq"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("run.id", ondelete="CASCADE"))
    seq: Mapped[int | None] = mapped_column(BigInteger)
    step: Mapped[int] = mapped_column(BigInteger)
    kind: Mapped[str] = mapped_column(String(64))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    time: Mapped[float | None] = mapped_column(Double)


class Token(Base):
    __tablename__ = "token"
    __table_args__ = (Index("ix_token_project", "project_id"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("project.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))
    #: sha256 of the secret; the secret itself is shown once at creation and never stored.
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: What the token may do, space-separated in ``SCOPES`` order: ``read``, ``write`` (ingest
    #: into the project's runs), ``manage`` (rename, tag, archive, restore, delete).
    scopes: Mapped[str] = mapped_column(String(64), server_default="read write")


# --- the models against the field table (``protocol.SAMPLE_FIELDS``), at import ------------------

#: The column type of each field type of the table.
SQL_TYPES: Final[dict[type, type[TypeEngine[Any]]]] = {int: BigInteger, float: Double, str: String}


def table_problems(fields: tuple[protocol.SampleField, ...] = protocol.SAMPLE_FIELDS) -> list[str]:
    """Where ``Sample`` and ``SampleBlock`` (written out, for typed queries) differ from the
    field table: each a sentence, none when they agree. ``sample`` stores the wire fields (the
    str field, ``series``, as its number ``SERIES_COLUMN``; a derived field not at all);
    ``sample_block``'s columns are the key and each field's aggregates, derived fields' too; a
    count is a BigInteger, an extreme or sum of an int field too, else a Double, nullable when
    the field is (a block of nulls sums to null)."""
    problems = []
    want: list[tuple[str, type, bool | None]] = [("run_id", BigInteger, False)]
    want += [
        (SERIES_COLUMN, Integer, False)
        if f.type is str
        else (f.name, SQL_TYPES[f.type], f.nullable)
        for f in fields
        if f.wire
    ]
    got = [(c.name, type(c.type), c.nullable) for c in Sample.__table__.columns]
    if [(name, kind) for name, kind, _ in got] != [(name, kind) for name, kind, _ in want]:
        problems.append(f"Sample's columns {got} are not the table's {want}")
    for (name, _, got_null), (_, _, want_null) in zip(got[1:], want[1:], strict=False):
        if got_null != want_null:
            problems.append(f"Sample.{name} nullable={got_null}, the table says {want_null}")
    block_want: list[tuple[str, type, bool | None]] = [("run_id", BigInteger, False)]
    block_want.append((SERIES_COLUMN, Integer, False))
    block_want += [("block", BigInteger, False)]
    for f in fields:
        for column, how in f.blocks:
            kind = BigInteger if how == "count" or f.type is int else Double
            block_want.append((column, kind, how != "count" and f.nullable))
    block_got = [(c.name, type(c.type), c.nullable) for c in SampleBlock.__table__.columns]
    if sorted(block_got, key=str) != sorted(block_want, key=str):
        problems.append(f"SampleBlock's columns {block_got} are not the table's {block_want}")
    return problems


assert not table_problems(), table_problems()
