"""The server's rules for one sample, row by row: the one statement of what a sample must be.

The server validates a request column by column (``noisescope_server.validate``, fast, in C
loops) and, when it refuses one, names every offending row with ``sample_problem``; the client
checks each row with it before sending, so one bad sample is dropped (counted) on its own and
never costs the good ones of its batch. A test holds the two forms to the same verdicts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Final

from noisescope._wire import MAX_NAME_LENGTH, MAX_SUMMED, SAMPLE_COLUMNS, SAMPLE_FIELDS
from noisescope.estimators._two_batch import two_batch_estimates, two_batch_sizes_ok

__all__ = ["INT64_MAX", "sample_problem"]

INT64_MAX: Final = 2**63 - 1
_NUMBER = (int, float)
_WIRE = [f for f in SAMPLE_FIELDS if f.wire]
_INTS = tuple(i for i, f in enumerate(_WIRE) if f.type is int)
#: (index, name, nullable, range) of each float column.
_FLOATS = tuple((i, f.name, f.nullable, f.range) for i, f in enumerate(_WIRE) if f.type is float)
_B_SMALL = SAMPLE_COLUMNS.index("b_small")
_B_BIG = SAMPLE_COLUMNS.index("b_big")
_G_SMALL_SQ = SAMPLE_COLUMNS.index("g_small_sq")
_G_BIG_SQ = SAMPLE_COLUMNS.index("g_big_sq")
_SERIES = SAMPLE_COLUMNS.index("series")


def _finite_number(value: Any) -> bool:
    if type(value) not in _NUMBER:  # bool and str are not numbers on the wire
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a double
        return False


def sample_problem(values: Sequence[Any]) -> str | None:
    """Why the server refuses the sample ``values`` (its wire columns in
    ``SAMPLE_COLUMNS`` order, as they would be sent), or None when it takes it."""
    if len(values) != len(SAMPLE_COLUMNS):
        return f"a sample has {len(SAMPLE_COLUMNS)} fields, got {len(values)}"
    for i in _INTS:
        value = values[i]
        if type(value) is not int:
            return f"{SAMPLE_COLUMNS[i]} must be an integer, got {value!r:.40}"
        if not 0 <= value <= INT64_MAX:
            return f"{SAMPLE_COLUMNS[i]} = {value} is out of range [0, 2^63-1]"
    for i, name, nullable, bounds in _FLOATS:
        value = values[i]
        if value is None and nullable:
            continue
        if not _finite_number(value):
            return f"{name} must be a finite number, got {value!r:.40}"
        if bounds is not None and not bounds[0] <= value <= bounds[1]:
            return f"{name} = {value!r:.40} is outside [{bounds[0]:.4g}, {bounds[1]:.4g}]"
    series = values[_SERIES]
    if type(series) is not str:
        return f"series must be a string, got {series!r:.40}"
    if len(series) > MAX_NAME_LENGTH:
        return f"series is longer than {MAX_NAME_LENGTH} characters"
    if "\x00" in series:
        return "series must not contain NUL (U+0000) characters"
    b_small, b_big = values[_B_SMALL], values[_B_BIG]
    if not two_batch_sizes_ok(b_small, b_big):
        return f"need 0 < b_small < b_big, got b_small={b_small}, b_big={b_big}"
    g_small_sq, g_big_sq = values[_G_SMALL_SQ], values[_G_BIG_SQ]
    if g_small_sq < 0 or g_big_sq < 0:
        return f"squared norms are >= 0, got {g_small_sq!r:.40} and {g_big_sq!r:.40}"
    try:
        estimates = two_batch_estimates(b_small, b_big, g_small_sq, g_big_sq)
    except (OverflowError, ZeroDivisionError):
        estimates = (math.inf, math.inf)
    if not all(math.isfinite(e) and abs(e) <= MAX_SUMMED for e in estimates):
        return (
            f"the squared norms are too large: the |G|^2 or tr(Sigma) estimate is beyond "
            f"±{MAX_SUMMED:.2g}, the largest magnitude the server sums"
        )
    return None
