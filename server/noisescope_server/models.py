"""SQLAlchemy 2 models. The schema itself is owned by Alembic (``migrations/``).

Samples store, beside the raw squared norms, the per-sample unbiased estimates |𝒢|^2 and 𝒮
computed once at ingest by ``noisescope.estimators``: every window or bucket query then only
sums columns, so the formula exists in one place and SQL stays linear.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    String,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# SQLite only auto-increments an INTEGER PRIMARY KEY, not a BIGINT one.
BigIntPK = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    pass


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


class Sample(Base):
    __tablename__ = "sample"
    __table_args__ = (Index("ix_sample_run_series_step", "run_id", "series", "step"),)

    run_id: Mapped[int] = mapped_column(
        ForeignKey("run.id", ondelete="CASCADE"), primary_key=True
    )
    #: Per-run sequence number assigned by the client; (run_id, seq) makes ingest idempotent.
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    step: Mapped[int] = mapped_column(BigInteger)
    examples: Mapped[float | None] = mapped_column(Double)
    b_small: Mapped[float] = mapped_column(Double)
    b_big: Mapped[float] = mapped_column(Double)
    g_small_sq: Mapped[float] = mapped_column(Double)
    g_big_sq: Mapped[float] = mapped_column(Double)
    g_sq_est: Mapped[float] = mapped_column(Double)
    trace_sigma_est: Mapped[float] = mapped_column(Double)
    loss: Mapped[float | None] = mapped_column(Double)
    lr: Mapped[float | None] = mapped_column(Double)
    time: Mapped[float | None] = mapped_column(Double)
    series: Mapped[str] = mapped_column(String(200), default="")


class Event(Base):
    __tablename__ = "event"
    __table_args__ = (Index("ix_event_run_step", "run_id", "step"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("run.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(BigInteger)
    kind: Mapped[str] = mapped_column(String(64))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    time: Mapped[float | None] = mapped_column(Double)


class Token(Base):
    __tablename__ = "token"

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("project.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))
    #: sha256 of the secret; the secret itself is shown once at creation and never stored.
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
