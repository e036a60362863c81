"""Token scopes, remembered deleted runs, and the run fields changed on the server.

- ``token.scopes``: what a token may do (``read``, ``write``, ``manage``, space-separated).
  Every existing token becomes ``read write``: what a job (ingest) and a dashboard (reads)
  need, so neither stops working; renaming, tagging, archiving, restoring and deleting runs
  now need a token with ``manage`` (the 403 says how to make one), so a dashboard's existing
  token no longer deletes runs.
- ``deleted_run``: the ids of deleted runs, whose writes answer 410 Gone. Runs deleted before
  this revision are not known (nothing recorded them).
- ``run.edited``: the fields (name, tags) a person changed with PATCH, which a job's PUT keeps;
  null for every existing run (nothing was marked before).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-07 02:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("token") as batch:
        batch.add_column(
            sa.Column("scopes", sa.String(length=64), nullable=False, server_default="read write")
        )
    with op.batch_alter_table("run") as batch:
        batch.add_column(sa.Column("edited", sa.JSON(), nullable=True))
    op.create_table(
        "deleted_run",
        sa.Column("uid", sa.String(length=64), nullable=False),
        # the project key's type (0001's KEY): BIGINT, INTEGER on SQLite
        sa.Column(
            "project_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["project.id"],
            name=op.f("fk_deleted_run_project_id_project"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("uid", name=op.f("pk_deleted_run")),
    )


def downgrade() -> None:
    op.drop_table("deleted_run")
    with op.batch_alter_table("run") as batch:
        batch.drop_column("edited")
    with op.batch_alter_table("token") as batch:
        batch.drop_column("scopes")
