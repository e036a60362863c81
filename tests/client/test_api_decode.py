"""``Api``'s decoder built once per type (``_decode.decoder``, for long answers such as a
run list of 10,000 runs) reads every answer type as ``_decode.decode`` does: the same value for
a valid answer, and a refusal (then ``decode`` says where and how) for every answer ``decode``
refuses."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from datetime import datetime, timezone
from typing import Any, Literal

import pytest

from noisescope import _decode
from noisescope._api import Access
from noisescope.forecast import ForecastReport
from noisescope.protocol import (
    EventRow,
    ParallelismPlan,
    RecommendationResult,
    RunBranches,
    RunSeries,
    RunSummary,
    SeriesInfo,
    TaskSummary,
)
from noisescope.sweep import CriticalBatchReport

#: Every type ``Api`` decodes an answer as (its ``_get`` calls).
ANSWERS: list[Any] = [
    list[str],
    list[RunSummary],
    RunSummary,
    RunSeries,
    list[RunSeries],
    list[SeriesInfo],
    list[EventRow],
    dict[str, int],
    RecommendationResult,
    Access,
    list[TaskSummary],
    CriticalBatchReport,
    RunBranches,
    ForecastReport,
    ParallelismPlan,
]


def _sample(tp: Any, depth: int = 0) -> Any:
    """A JSON value of the shape ``tp`` describes: one item per list, every field present."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        return _sample(options[0], depth) if depth < 4 else None
    if origin in (list, tuple):
        return [_sample(typing.get_args(tp)[0], depth + 1)] if depth < 4 else []
    if origin is dict:
        return {"a": 1}
    if origin is Literal:
        return typing.get_args(tp)[0]
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        hints = typing.get_type_hints(tp)
        return {f.name: _sample(hints[f.name], depth + 1) for f in dataclasses.fields(tp)}
    if tp is datetime:
        return datetime(2026, 12, 7, 5, 30, tzinfo=timezone.utc).isoformat()
    return {float: 1.5, int: 2, str: "s", bool: True}.get(tp, "s")


def _paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON value."""
    out = [at]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*at, i))
    return out


def _mutants(value: Any) -> list[Any]:
    """The value with one place replaced by a value of another kind, or one key left out."""
    out = []
    for path in _paths(value)[1:]:
        others: tuple[Any, ...] = (None, "x", 3, 2.5, True, [], {}, "2026-13-99", ...)
        for other in others:
            copy = json.loads(json.dumps(value))
            holder = copy
            for key in path[:-1]:
                holder = holder[key]
            if other is ...:
                if isinstance(holder, dict):
                    del holder[path[-1]]
                    out.append(copy)
            else:
                holder[path[-1]] = other
                out.append(copy)
    return out


def _read(read: Any) -> tuple[str, Any]:
    try:
        return "value", read()
    except _decode.Shape:
        return "refused", None


@pytest.mark.parametrize("tp", ANSWERS, ids=str)
def test_the_fast_decoder_reads_every_answer_as_decode_does(tp: Any) -> None:
    valid = _sample(tp)
    assert _read(lambda: _decode.decode(tp, valid))[0] == "value"
    cases = [valid, None, "x", [], {}, *_mutants(valid)]
    refused = 0
    for value in cases:
        slow = _read(lambda v=value: _decode.decode(tp, v))
        fast = _read(lambda v=value: _decode.decoder(tp)(v))
        assert fast == slow, value
        refused += slow[0] == "refused"
    assert refused > 0
