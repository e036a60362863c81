"""Branch runs: a run may be a branch of another (``noisescope.branch``).

``parent_uid`` is the parent run's client id (not a foreign key: a branch may be logged before
its parent, from another process) and ``branch_step`` the parent's step it started from; the
index serves ``GET /runs/{run_id}/branches``.

Revision ID: 0003
Revises: 0001
Create Date: 2026-12-01 11:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("run") as batch:
        batch.add_column(sa.Column("parent_uid", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("branch_step", sa.BigInteger(), nullable=True))
        batch.create_index("ix_run_parent_uid", ["parent_uid"])


def downgrade() -> None:
    with op.batch_alter_table("run") as batch:
        batch.drop_index("ix_run_parent_uid")
        batch.drop_column("branch_step")
        batch.drop_column("parent_uid")
