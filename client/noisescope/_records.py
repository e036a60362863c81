"""A committed sample as the client holds it (``SampleRow``), and the conversion of a batch of
them to the wire's columns, off the training thread (``rows_to_columns``, called by the outbox
as it takes a batch: ``_delivery._outbox.Outbox.take``).
"""

from __future__ import annotations

import functools
import math
import typing
from collections.abc import Callable
from typing import Any, NamedTuple

from noisescope import _wire
from noisescope._sample_rule import INT64_MAX, sample_problem

Columns = dict[str, list[Any]]


class SampleRow(NamedTuple):
    """One committed sample, as a row until its batch is taken (then it is columns): the
    ``_wire.SAMPLE_COLUMNS`` in order. Not the server's stored ``models.Sample``."""

    seq: int
    step: int
    examples: float | None
    b_small: float
    b_big: float
    g_small_sq: float
    g_big_sq: float
    loss: float | None
    lr: float | None
    time: float
    series: str


def sample_problems(fields: tuple[_wire.SampleField, ...] = _wire.SAMPLE_FIELDS) -> list[str]:
    """Where ``SampleRow`` differs from the field table's wire fields (names, order, types):
    each a sentence, none when they agree. The fields the client fills in itself (``time``) are
    never None on this side."""
    wire = [f for f in fields if f.wire]
    want = {f.name: f.type | None if f.nullable and f.logged else f.type for f in wire}
    got = typing.get_type_hints(SampleRow)
    if tuple(got) != tuple(want):
        return [f"SampleRow's fields {tuple(got)} are not the wire fields {tuple(want)}"]
    differ = [name for name in want if got[name] != want[name]]
    return [f"SampleRow.{name} is {got[name]}, the table says {want[name]}" for name in differ]


#: ``SampleRow`` stays written out (the training thread builds one per sample): it is checked
#: against the field table (``_wire.SAMPLE_FIELDS``) here, at import.
assert not sample_problems(), sample_problems()

#: ``SampleRow`` from a tuple of its fields without NamedTuple's argument parsing: the training
#: thread builds one per sample (0.1 µs instead of 0.5 µs).
new_sample: Callable[[tuple[Any, ...]], SampleRow] = functools.partial(tuple.__new__, SampleRow)


def _indices(*names: str) -> tuple[int, ...]:
    return tuple(SampleRow._fields.index(name) for name in names)


_WIRE = [f for f in _wire.SAMPLE_FIELDS if f.wire]
_INTEGER = _indices(*(f.name for f in _WIRE if f.type is int))
_FLOAT_REQUIRED = _indices(*(f.name for f in _WIRE if f.type is float and not f.nullable))
_FLOAT_OPTIONAL = _indices(*(f.name for f in _WIRE if f.type is float and f.nullable))
#: The range of each optional column (``_wire.SAMPLE_RANGES``), by index: outside, null.
_RANGES = {SampleRow._fields.index(name): r for name, r in _wire.SAMPLE_RANGES.items()}
_SERIES = SampleRow._fields.index("series")
#: Distinct batch-size pairs in a batch up to which the fast path bounds the estimates.
_PAIRS_MAX = 16
assert all(_RANGES.get(i) for i in _FLOAT_OPTIONAL), "every optional float field has a range"


def _open(name: str) -> int:
    return SampleRow._fields.index(name) - 1


#: Positions in the Run's open record of a step: a ``SampleRow``'s fields after ``seq``, in a
#: list that a later ``log_sample`` of the same step and series updates in place.
OPEN_EXAMPLES = _open("examples")
OPEN_B_SMALL = _open("b_small")
OPEN_B_BIG = _open("b_big")
OPEN_G_SMALL_SQ = _open("g_small_sq")
OPEN_G_BIG_SQ = _open("g_big_sq")
OPEN_LOSS = _open("loss")
OPEN_LR = _open("lr")


def _finite_or_none(value: Any, lowest: float, highest: float) -> float | None:
    """``value`` as a float, or None when it is none, non-finite or outside the range."""
    if value is None:
        return None
    number = float(value)
    return number if math.isfinite(number) and lowest <= number <= highest else None


def json_safe(value: Any) -> Any:
    """Event payloads as JSON: non-finite floats become null, unknown objects their str."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)


def _fast_columns(rows: list[SampleRow], series_prefix: str) -> Columns | None:
    """Column-wise conversion with C-level loops (map/all), for the common all-valid batch.

    Keeps the sender's hold on the GIL short, so the training thread rarely waits for it.
    Returns None if any value needs the careful per-row path.
    """
    try:
        cols = list(zip(*rows, strict=True))
        if len(cols) != len(_wire.SAMPLE_COLUMNS):
            return None
        out: Columns = {}
        isfinite = math.isfinite
        for index, name in enumerate(_wire.SAMPLE_COLUMNS):
            col = cols[index]
            if index in _INTEGER:
                values: list[Any] = list(map(int, col))
            elif index in _FLOAT_REQUIRED:
                values = list(map(float, col))
                if not all(map(isfinite, values)):
                    return None
            elif index in _FLOAT_OPTIONAL:
                if None in col:
                    if col.count(None) != len(col):
                        return None  # some logged, some not: the per-row path
                    values = list(col)  # not logged at all (e.g. no examples): nulls
                else:
                    values = list(map(float, col))
                    if not all(map(isfinite, values)):
                        return None
                    lowest, highest = _RANGES[index]
                    if min(values) < lowest or max(values) > highest:
                        return None
            else:
                values = list(map(str, col))
                if series_prefix:
                    values = [f"{series_prefix}/{v}" if v else series_prefix for v in values]
            out[name] = values
        return out if _all_taken(out) else None
    except (TypeError, ValueError, OverflowError):
        return None


def _all_taken(out: Columns) -> bool:
    """Whether the server takes every row of finite, typed columns (``sample_problem``'s
    rules, checked whole-column; False sends the batch down the per-row path)."""
    step = out["step"]
    if min(step) < 0 or max(step) > INT64_MAX or max(out["seq"]) > INT64_MAX:
        return False
    # a batch holds one series and one pair of batch sizes, usually: then each is one value
    series = out["series"]
    names = series[:1] if _uniform(series) else set(series)
    if any(len(s) > _wire.MAX_NAME_LENGTH or "\x00" in s for s in names):
        return False
    smalls, bigs = out["b_small"], out["b_big"]
    if _uniform(smalls) and _uniform(bigs):
        pairs = {(smalls[0], bigs[0])}
    else:
        pairs = set(zip(smalls, bigs, strict=True))
    if len(pairs) > _PAIRS_MAX:
        return False
    g_small_sq, g_big_sq = out["g_small_sq"], out["g_big_sq"]
    if min(g_small_sq) < 0 or min(g_big_sq) < 0:
        return False
    g_max = max(max(g_small_sq), max(g_big_sq))
    for b_small, b_big in pairs:
        if not b_big > b_small > 0:
            return False
        # |G|^2 and tr(Sigma) estimates (eq. A.1) are at most g_max times these factors
        gap = b_big - b_small
        if g_max * max((b_big + b_small) / gap, b_small * b_big / gap) > _wire.MAX_SUMMED:
            return False
    return True


def _uniform(column: list[Any]) -> bool:
    """Whether a (non-empty) column holds one value throughout: one C-level count."""
    return column.count(column[0]) == len(column)


def rows_to_columns(rows: list[SampleRow], series_prefix: str = "") -> tuple[Columns, list[str]]:
    """Column-wise wire payload from rows, and why each row the server would refuse was left
    out (``_sample_rule.sample_problem``: one bad sample never costs its batch).

    Done here, off the training thread, so the hot path never converts or validates; called
    in one place, as the outbox takes a batch (``Outbox.take``): a batch keeps this form. A
    non-finite loss, lr, examples or time becomes null (JSON has no NaN), as does one outside
    the range the server takes (``_wire.SAMPLE_RANGES``); a non-finite squared norm makes the
    sample unusable (docs/science.md, Pitfalls: skip non-finite gradients) and it is left out.
    """
    if rows:
        fast = _fast_columns(rows, series_prefix)
        if fast is not None:
            return fast, []
    good: list[tuple[Any, ...]] = []
    refused: list[str] = []
    for row in rows:
        try:
            values: list[Any] = list(row)  # the user gave anything: checked here
            for i in _FLOAT_REQUIRED:
                values[i] = float(values[i])  # non-finite: refused by sample_problem
            for i in _FLOAT_OPTIONAL:
                values[i] = _finite_or_none(values[i], *_RANGES[i])
            for i in _INTEGER:
                values[i] = int(values[i])
            series = str(values[_SERIES])
            if series_prefix:
                series = f"{series_prefix}/{series}" if series else series_prefix
            values[_SERIES] = series
            problem = sample_problem(values)
        except (TypeError, ValueError, IndexError, OverflowError) as exc:
            problem = f"a field is not a number ({type(exc).__name__}: {exc})"
        if problem is not None:
            refused.append(problem)
            continue
        good.append(tuple(values))
    if not good:
        return {name: [] for name in _wire.SAMPLE_COLUMNS}, refused
    columns = {
        name: list(col)
        for name, col in zip(_wire.SAMPLE_COLUMNS, zip(*good, strict=True), strict=True)
    }
    return columns, refused


def select_rows(columns: Columns, rows: list[int]) -> Columns:
    """The samples ``rows`` (indices, in that order) of ``columns``."""
    return {name: [values[i] for i in rows] for name, values in columns.items()}
