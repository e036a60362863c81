"""Initial schema: project, task, run, sample (+ sample_block sums), event, token.

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-30 08:56:32.423397
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


#: Integer keys: BIGINT on PostgreSQL; INTEGER on SQLite, whose autoincrementing rowid alias
#: must be spelt exactly INTEGER PRIMARY KEY.
KEY = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _id() -> sa.Column[int]:
    return sa.Column("id", KEY, autoincrement=True, nullable=False)


def _cascade(table: str, parent: str) -> sa.ForeignKeyConstraint:
    """``table.<parent>_id`` references ``parent.id``; deleting the parent deletes the rows."""
    column = f"{parent}_id"
    return sa.ForeignKeyConstraint(
        [column], [f"{parent}.id"], name=op.f(f"fk_{table}_{column}_{parent}"), ondelete="CASCADE"
    )


def upgrade() -> None:
    op.create_table(
        "project",
        _id(),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_project")),
        sa.UniqueConstraint("name", name=op.f("uq_project_name")),
    )
    op.create_table(
        "task",
        _id(),
        sa.Column("project_id", KEY, nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        _cascade("task", "project"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_task")),
        sa.UniqueConstraint("project_id", "name", name="uq_task_project_name"),
    )
    op.create_table(
        "token",
        _id(),
        sa.Column("project_id", KEY, nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        _cascade("token", "project"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_token")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_token_token_hash")),
    )
    op.create_index("ix_token_project", "token", ["project_id"], unique=False)
    op.create_table(
        "run",
        _id(),
        sa.Column("uid", sa.String(length=64), nullable=False),
        sa.Column("project_id", KEY, nullable=False),
        sa.Column("task_id", KEY, nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("batch_size", sa.Double(), nullable=True),
        sa.Column("units", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=True),
        _cascade("run", "project"),
        _cascade("run", "task"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_run")),
        sa.UniqueConstraint("uid", name=op.f("uq_run_uid")),
    )
    op.create_index("ix_run_project_task", "run", ["project_id", "task_id"], unique=False)
    op.create_index("ix_run_started_at", "run", ["started_at"], unique=False)
    op.create_table(
        "event",
        _id(),
        sa.Column("run_id", KEY, nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=True),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("time", sa.Double(), nullable=True),
        _cascade("event", "run"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_event")),
        sa.UniqueConstraint("run_id", "seq", name="uq_event_run_seq"),
    )
    op.create_index("ix_event_run_step", "event", ["run_id", "step"], unique=False)
    op.create_table(
        "sample",
        sa.Column("run_id", KEY, nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("examples", sa.Double(), nullable=True),
        sa.Column("b_small", sa.Double(), nullable=False),
        sa.Column("b_big", sa.Double(), nullable=False),
        sa.Column("g_small_sq", sa.Double(), nullable=False),
        sa.Column("g_big_sq", sa.Double(), nullable=False),
        sa.Column("g_sq_est", sa.Double(), nullable=False),
        sa.Column("trace_sigma_est", sa.Double(), nullable=False),
        sa.Column("loss", sa.Double(), nullable=True),
        sa.Column("lr", sa.Double(), nullable=True),
        sa.Column("time", sa.Double(), nullable=True),
        sa.Column("series", sa.String(length=200), nullable=False),
        _cascade("sample", "run"),
        sa.PrimaryKeyConstraint("run_id", "seq", name=op.f("pk_sample")),
        sqlite_with_rowid=False,
    )
    op.create_table(
        "sample_block",
        sa.Column("run_id", KEY, nullable=False),
        sa.Column("series", sa.String(length=200), nullable=False),
        sa.Column("block", sa.BigInteger(), nullable=False),
        sa.Column("n", sa.BigInteger(), nullable=False),
        sa.Column("sum_g_sq", sa.Double(), nullable=False),
        sa.Column("sum_trace_sigma", sa.Double(), nullable=False),
        sa.Column("n_loss", sa.BigInteger(), nullable=False),
        sa.Column("sum_loss", sa.Double(), nullable=True),
        sa.Column("n_lr", sa.BigInteger(), nullable=False),
        sa.Column("sum_lr", sa.Double(), nullable=True),
        sa.Column("step_min", sa.BigInteger(), nullable=False),
        sa.Column("step_max", sa.BigInteger(), nullable=False),
        sa.Column("examples_min", sa.Double(), nullable=True),
        sa.Column("examples_max", sa.Double(), nullable=True),
        sa.Column("time_min", sa.Double(), nullable=True),
        sa.Column("time_max", sa.Double(), nullable=True),
        sa.Column("b_big_max", sa.Double(), nullable=False),
        _cascade("sample_block", "run"),
        sa.PrimaryKeyConstraint("run_id", "series", "block", name=op.f("pk_sample_block")),
        sqlite_with_rowid=False,
    )


def downgrade() -> None:
    op.drop_table("sample_block")
    op.drop_table("sample")
    op.drop_index("ix_event_run_step", table_name="event")
    op.drop_table("event")
    op.drop_index("ix_run_started_at", table_name="run")
    op.drop_index("ix_run_project_task", table_name="run")
    op.drop_table("run")
    op.drop_index("ix_token_project", table_name="token")
    op.drop_table("token")
    op.drop_table("task")
    op.drop_table("project")
