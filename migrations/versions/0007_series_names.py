"""Series names stored once per run, and no stored per-sample estimate.

A new ``series`` table holds each run's series names once, numbered per run (the whole
model's "" is 0, a run's other names 1, 2, ... in name order); ``sample``, ``sample_block``
and ``sample_chunk`` carry the number (``series_id``) instead of the name. ``sample`` loses
``g_sq_est`` and ``trace_sigma_est``, a function of four other columns that readers derive
(``queries._samples``) with the expressions ingest computed them with, so every sample reads
back the same floats. Each table is copied into its new layout and swapped in (PostgreSQL
keeps no dead space from dropped columns; SQLite would copy the table anyway); the copy
checks that no row was lost.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-07 05:30:00
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

KEY = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_FLOATS = ("examples", "b_small", "b_big", "g_small_sq", "g_big_sq")
_OPTIONAL = ("loss", "lr", "time")
#: ``sample``'s columns before and after, but its series and estimates.
_SAMPLE = ("run_id", "seq", "step", *_FLOATS, *_OPTIONAL)
_BLOCK = (
    "block", "n", "sum_g_sq", "sum_trace_sigma", "n_loss", "sum_loss", "n_lr", "sum_lr",
    "step_min", "step_max", "examples_min", "examples_max", "time_min", "time_max", "b_big_max",
)  # fmt: skip
_CHUNK = ("seq_first", "seq_last", "n", "data")
#: What a new table's key name ends with until it is swapped in.
_NEW = {"sqlite": "", "postgresql": "_new"}


def _sample_columns(old: bool) -> list[sa.Column[Any]]:
    nullable = {"examples", *_OPTIONAL}
    columns: list[sa.Column[Any]] = [
        sa.Column("run_id", KEY, nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
    ]
    names = [*_FLOATS, "g_sq_est", "trace_sigma_est", *_OPTIONAL] if old else _SAMPLE[3:]
    columns += [sa.Column(c, sa.Double(), nullable=c in nullable) for c in names]
    if old:
        columns.append(sa.Column("series", sa.String(length=200), nullable=False))
    else:
        columns.append(sa.Column("series_id", sa.Integer(), nullable=False))
    return columns


def _block_columns(old: bool) -> list[sa.Column[Any]]:
    counts = {"n", "n_loss", "n_lr", "step_min", "step_max", "block"}
    nullable = {"sum_loss", "sum_lr", "examples_min", "examples_max", "time_min", "time_max"}
    series = (
        sa.Column("series", sa.String(length=200), nullable=False)
        if old
        else sa.Column("series_id", sa.Integer(), autoincrement=False, nullable=False)
    )
    columns: list[sa.Column[Any]] = [sa.Column("run_id", KEY, nullable=False), series]
    columns += [
        sa.Column(c, sa.BigInteger() if c in counts else sa.Double(), nullable=c in nullable)
        for c in _BLOCK
    ]
    return columns


def _chunk_columns(old: bool) -> list[sa.Column[Any]]:
    series = (
        sa.Column("series", sa.String(length=200), nullable=False)
        if old
        else sa.Column("series_id", sa.Integer(), autoincrement=False, nullable=False)
    )
    return [
        sa.Column("run_id", KEY, nullable=False),
        series,
        sa.Column("seq_first", sa.BigInteger(), nullable=False),
        sa.Column("seq_last", sa.BigInteger(), nullable=False),
        sa.Column("n", sa.BigInteger(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
    ]


def _create(name: str, columns: list[sa.Column[Any]], key: list[str]) -> None:
    """``name``_new with ``columns``, keyed ``key``, its run cascading, clustered on SQLite."""
    op.create_table(
        f"{name}_new",
        *columns,
        sa.ForeignKeyConstraint(
            ["run_id"], ["run.id"], name=f"fk_{name}_run_id_run", ondelete="CASCADE"
        ),
        # PostgreSQL names the key's index after it, which the old table's still holds
        sa.PrimaryKeyConstraint(*key, name=f"pk_{name}{_NEW[op.get_bind().dialect.name]}"),
        sqlite_with_rowid=False,
    )


def _swap(name: str) -> None:
    """``name``_new in place of ``name``, after checking it holds as many rows."""
    conn = op.get_bind()
    count = "SELECT count(*) FROM {}"
    before = conn.execute(sa.text(count.format(name))).scalar_one()
    after = conn.execute(sa.text(count.format(f"{name}_new"))).scalar_one()
    if before != after:
        raise RuntimeError(f"{name}: {before} rows, {after} after conversion; nothing changed")
    op.drop_table(name)
    op.rename_table(f"{name}_new", name)
    if conn.dialect.name == "postgresql":
        op.execute(f"ALTER TABLE {name} RENAME CONSTRAINT pk_{name}_new TO pk_{name}")


def _copy(name: str, columns: Sequence[str], series_from: str, series_to: str) -> None:
    """``name``'s rows into ``name``_new, the series read through the ``series`` table."""
    listed = ", ".join(columns)
    picked = ", ".join(f"t.{c}" for c in columns)
    join = (
        "s.id" if series_to == "series_id" else "s.name",
        f"s.name = t.{series_from}" if series_from == "series" else f"s.id = t.{series_from}",
    )
    op.execute(
        f"INSERT INTO {name}_new ({listed}, {series_to}) SELECT {picked}, {join[0]} "
        f"FROM {name} t JOIN series s ON s.run_id = t.run_id AND {join[1]}"
    )


def upgrade() -> None:
    op.create_table(
        "series",
        sa.Column("run_id", KEY, nullable=False),
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["run.id"], name=op.f("fk_series_run_id_run"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "id", name=op.f("pk_series")),
        sa.UniqueConstraint("run_id", "name", name="uq_series_run_name"),
    )
    # every name a run has, wherever it is: the whole model's is 0, the others 1, 2, ...
    op.execute(
        "INSERT INTO series (run_id, id, name) "
        "SELECT run_id, CASE WHEN series = '' THEN 0 ELSE row_number() OVER "
        "(PARTITION BY run_id, series = '' ORDER BY series) END, series FROM "
        "(SELECT run_id, series FROM sample_block UNION SELECT run_id, series FROM sample "
        "UNION SELECT run_id, series FROM sample_chunk) names"
    )
    _create("sample", _sample_columns(old=False), ["run_id", "seq"])
    _copy("sample", _SAMPLE, "series", "series_id")
    _swap("sample")
    _blocks_and_chunks(old=False)


def _blocks_and_chunks(old: bool) -> None:
    """``sample_block`` and ``sample_chunk`` in the layout of 0006 (``old``: the name in each
    row) or of 0007 (the number), the one from the other through the ``series`` table."""
    series, other = ("series", "series_id") if old else ("series_id", "series")
    for name, columns, rest in (
        ("sample_block", _block_columns, _BLOCK),
        ("sample_chunk", _chunk_columns, _CHUNK),
    ):
        _create(name, columns(old), ["run_id", series, rest[0]])
        _copy(name, ("run_id", *rest), other, series)
        _swap(name)


def downgrade() -> None:
    """Names back in every row, and each sample's estimates computed as ingest stored them
    (``estimators.two_batch_estimates``)."""
    from noisescope.estimators import two_batch_estimates

    conn = op.get_bind()
    _create("sample", _sample_columns(old=True), ["run_id", "seq"])
    new = sa.table("sample_new", *(sa.column(c.name) for c in _sample_columns(old=True)))
    read = sa.text(
        f"SELECT {', '.join(f't.{c}' for c in _SAMPLE)}, s.name FROM sample t "
        "JOIN series s ON s.run_id = t.run_id AND s.id = t.series_id "
        "WHERE (t.run_id, t.seq) > (:run_id, :seq) ORDER BY t.run_id, t.seq LIMIT 10000"
    )
    after = {"run_id": -(2**63), "seq": -(2**63)}
    while True:
        page = conn.execute(read, after).all()
        if not page:
            break
        rows = []
        for values in page:
            row = dict(zip((*_SAMPLE, "series"), values, strict=True))
            row["g_sq_est"], row["trace_sigma_est"] = two_batch_estimates(
                row["b_small"], row["b_big"], row["g_small_sq"], row["g_big_sq"]
            )
            rows.append(row)
        conn.execute(new.insert(), rows)
        after = {"run_id": page[-1][0], "seq": page[-1][1]}
    _swap("sample")
    _blocks_and_chunks(old=True)
    op.drop_table("series")
