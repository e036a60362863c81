"""``queries.CurrentFields`` restates fields of ``RunSummary`` (the server fills them with
``RunSummary(..., **fields)``): each under the same name with the same type, so that a change to
one that the other does not follow fails here rather than on a read."""

from __future__ import annotations

import typing

from noisescope.protocol import RunSummary
from noisescope_server.queries._current import CurrentFields, no_current


def test_current_fields_are_run_summary_fields_of_the_same_type() -> None:
    summary = typing.get_type_hints(RunSummary)
    current = typing.get_type_hints(CurrentFields)
    assert len(current) == 12
    assert {name: summary.get(name) for name in current} == current


def test_no_current_fills_every_field() -> None:
    fields = no_current("no samples")
    assert set(fields) == set(CurrentFields.__annotations__)
    assert fields["b_simple_reason"] == "no samples" and fields["window_samples"] == 0
