"""The column list that the insert path and the CSV export share matches the table."""

from __future__ import annotations

from noisescope import _wire
from noisescope_server.models import SAMPLE_COLUMNS, SERIES_COLUMN, Sample


def test_sample_columns_are_the_table_columns_after_run_id() -> None:
    names = [c.name for c in Sample.__table__.columns]
    assert names[0] == "run_id"
    assert tuple(names[1:]) == SAMPLE_COLUMNS


def test_every_wire_column_is_stored_and_no_derived_one() -> None:
    """The series as its number in the run; the estimates, a function of four stored
    columns, not at all (readers derive them)."""
    stored = tuple("series" if c == SERIES_COLUMN else c for c in SAMPLE_COLUMNS)
    assert stored == _wire.SAMPLE_COLUMNS == _wire.STORED_COLUMNS
    assert set(SAMPLE_COLUMNS).isdisjoint(_wire.DERIVED_COLUMNS)
    assert set(_wire.DERIVED_COLUMNS) == {"g_sq_est", "trace_sigma_est"}


def test_block_sums_fill_every_sample_block_column() -> None:
    from noisescope_server.crud import _sql
    from noisescope_server.models import SampleBlock

    assert {c.name for c in SampleBlock.__table__.columns} == {"run_id", *_sql.BLOCK_COLUMNS}
