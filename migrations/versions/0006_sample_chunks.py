"""Compacted runs: ``sample_chunk``, a finished run's samples as compressed column chunks,
and ``run_digest``, what a run list computes per compacted run, stored once.

A chunk is up to 4096 consecutive samples of one (run, series) in one blob
(``noisescope_server.chunks``); compaction (``crud.compact_run``) moves a run's ``sample`` rows
into chunks, and readers merge rows and chunks. Existing rows stay rows until compacted:
nothing is converted here, so every stored sample reads back as before.

Revision ID: 0006
Revises: 0004
Create Date: 2026-12-07 02:50:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "sample_chunk",
        sa.Column("run_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("series", sa.String(200), nullable=False),
        sa.Column("seq_first", sa.BigInteger(), nullable=False),
        sa.Column("seq_last", sa.BigInteger(), nullable=False),
        sa.Column("n", sa.BigInteger(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["run.id"], name=op.f("fk_sample_chunk_run_id_run"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "series", "seq_first", name=op.f("pk_sample_chunk")),
        sqlite_with_rowid=False,
    )
    op.create_table(
        "run_digest",
        sa.Column("run_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("n_samples", sa.BigInteger(), nullable=False),
        sa.Column("n_all", sa.BigInteger(), nullable=False),
        sa.Column("current", sa.Text(), nullable=False),
        sa.Column("last_loss", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"], ["run.id"], name=op.f("fk_run_digest_run_id_run"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_run_digest")),
    )


_s = sa.table(
    "sample",
    sa.column("seq", sa.BigInteger()),
    *(sa.column(c) for c in ("run_id", "step", "examples", "b_big", "g_sq_est",
                             "trace_sigma_est", "loss", "lr", "time", "series")),
)  # fmt: skip
#: One series' seq blocks from its rows, as revision 0006's ingest summed them.
_SUMS = {
    "n": sa.func.count(_s.c.seq),
    "step_min": sa.func.min(_s.c.step),
    "step_max": sa.func.max(_s.c.step),
    "examples_min": sa.func.min(_s.c.examples),
    "examples_max": sa.func.max(_s.c.examples),
    "b_big_max": sa.func.max(_s.c.b_big),
    "sum_g_sq": sa.func.sum(_s.c.g_sq_est),
    "sum_trace_sigma": sa.func.sum(_s.c.trace_sigma_est),
    "n_loss": sa.func.count(_s.c.loss),
    "sum_loss": sa.func.sum(_s.c.loss),
    "n_lr": sa.func.count(_s.c.lr),
    "sum_lr": sa.func.sum(_s.c.lr),
    "time_min": sa.func.min(_s.c.time),
    "time_max": sa.func.max(_s.c.time),
}
_BLOCK_KEY = ("run_id", "series", "block")
_LAYER_BLOCKS = sa.insert(
    sa.table("sample_block", *(sa.column(c) for c in (*_BLOCK_KEY, *_SUMS)))
).from_select(
    [*_BLOCK_KEY, *_SUMS],
    sa.select(
        _s.c.run_id,
        _s.c.series,
        (_s.c.seq // 64).label("block"),
        *(value.label(name) for name, value in _SUMS.items()),
    )
    .where(_s.c.run_id == sa.bindparam("r"), _s.c.series == sa.bindparam("s"))
    .group_by(_s.c.run_id, _s.c.series, sa.text("block")),
)


def downgrade() -> None:
    """Back to rows: every chunk's samples into ``sample`` (estimates recomputed as ingest
    computes them) and a compacted layer's block sums back to blocks by seq, then the tables
    go."""
    from noisescope.estimators import two_batch_estimates
    from noisescope_server.chunks import decode_chunk

    conn = op.get_bind()
    sample = sa.table(
        "sample",
        *(sa.column(c) for c in ("run_id", "seq", "step", "examples", "b_small", "b_big",
                                 "g_small_sq", "g_big_sq", "g_sq_est", "trace_sigma_est",
                                 "loss", "lr", "time", "series")),
    )  # fmt: skip
    chunks = conn.execute(sa.text("SELECT run_id, series, data FROM sample_chunk")).all()
    for run_id, series, data in chunks:
        cols = decode_chunk(bytes(data))
        rows = []
        for i in range(len(cols["seq"])):
            row = {name: values[i] for name, values in cols.items()}
            g_sq, trace_sigma = two_batch_estimates(
                row["b_small"], row["b_big"], row["g_small_sq"], row["g_big_sq"]
            )
            rows.append({**row, "run_id": run_id, "series": series, "g_sq_est": g_sq,
                         "trace_sigma_est": trace_sigma})  # fmt: skip
        if rows:
            conn.execute(sample.insert(), rows)
    # a compacted layer's samples were summed in blocks keyed below 0: back to seq blocks
    # (the block sums of this revision's tables, written out: later code has other tables)
    layers = {(run_id, series) for run_id, series, _ in chunks if series != ""}
    conn.execute(sa.text("DELETE FROM sample_block WHERE block < 0"))
    for run_id, series in sorted(layers):
        conn.execute(
            sa.text("DELETE FROM sample_block WHERE run_id = :r AND series = :s"),
            {"r": run_id, "s": series},
        )
        conn.execute(_LAYER_BLOCKS, {"r": run_id, "s": series})
    op.drop_table("run_digest")
    op.drop_table("sample_chunk")
