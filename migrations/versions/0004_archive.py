"""Archived runs: ``archived_at`` on the run table (null: not archived).

Archiving is the restorable way to remove a run from lists, sweeps and comparisons; older
rows are null, so every stored run reads as not archived: no backfill.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-04 22:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("run") as batch:
        batch.add_column(sa.Column("archived_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("run") as batch:
        batch.drop_column("archived_at")
