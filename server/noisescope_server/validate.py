"""Wire validation of ingest requests: run ids and the columnar samples body, into a SampleBatch;
and a branch run's plan in its config (``branch_plan_problem``).

Whole-column checks in C keep sample validation at a few hundred nanoseconds per sample:
``set(map(type, col))`` for types, ``sum`` for finiteness, ``col == sorted(col)`` for order
(then the ends are the extremes), ``list.count`` for columns that hold one value (series, batch
sizes and lr, usually), which are then checked once. The slow per-element scan runs only to
locate the first bad element for the error message. The per-sample unbiased estimates |𝒢|^2 and
𝒮 (docs/science.md, two-batch estimator) come from ``noisescope.estimators`` so SQL only ever
sums them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from noisescope import protocol
from noisescope.estimators import (
    epsilon_problem,
    two_batch_estimate_columns,
    two_batch_estimates,
    two_batch_sizes_ok,
)
from noisescope_server.errors import BadInput

__all__ = ["SampleBatch", "branch_plan_problem", "check_run_uid", "validate_samples"]

_INT64_MAX = 2**63 - 1
#: The wire columns by kind, from the field table (``protocol.SAMPLE_FIELDS``), which only
#: has required int fields, float fields and the one str field, ``series``.
_WIRE_FIELDS = [f for f in protocol.SAMPLE_FIELDS if f.wire]
_INT_COLUMNS = tuple(f.name for f in _WIRE_FIELDS if f.type is int)
FLOAT_COLUMNS = tuple(f.name for f in _WIRE_FIELDS if f.type is float)
#: Float columns that clients send in order (their order lets block extremes be the ends).
_ORDERED_FLOAT_COLUMNS = frozenset({"examples", "time"})
#: Float columns that usually hold one value per request (checked once when they do).
_USUALLY_UNIFORM_COLUMNS = frozenset({"b_small", "b_big", "lr"})
#: Why each column has its range (``protocol.SAMPLE_RANGES``; the estimates are bounded alike).
_RANGE_WHY = {f.name: f.range_why for f in protocol.SAMPLE_FIELDS if f.range is not None}
_SUMMED_RULE = (
    f"beyond ±{protocol.MAX_SUMMED:.2g} (noisescope._wire.MAX_SUMMED), the largest magnitude "
    "the server sums (a run's sums of up to 2^63 of them stay finite)"
)
_NUMBER_TYPES = frozenset({int, float})
_NULLABLE_NUMBER_TYPES = frozenset({int, float, type(None)})


def check_run_uid(run_uid: str) -> str:
    """``run_uid`` if it is a valid run id (``protocol.run_id_problem``), else BadInput."""
    problem = protocol.run_id_problem(run_uid)
    if problem is not None:
        raise BadInput(problem)
    return run_uid


@dataclass(frozen=True)
class SampleBatch:
    """Validated columns, each a list of length ``n``, plus the per-sample estimates.

    Also what validation learnt on the way, so the block sums need not scan again:
    ``null_columns`` hold at least one null; ``uniform_columns`` hold one value throughout and
    ``ascending_columns`` are in non-decreasing order (only some columns are looked at: seq,
    step, examples and time for order; series, the batch sizes and lr for uniformity).
    """

    n: int
    columns: dict[str, list[Any]]
    g_sq_est: list[float]
    trace_sigma_est: list[float]
    null_columns: frozenset[str]
    uniform_columns: frozenset[str]
    ascending_columns: frozenset[str]


@dataclass
class _Found:
    """What the column checkers learn about the columns they pass (see SampleBatch)."""

    null: set[str] = field(default_factory=set)
    uniform: set[str] = field(default_factory=set)
    ascending: set[str] = field(default_factory=set)


def validate_samples(
    payload: Any, *, max_samples: int = protocol.MAX_SAMPLES_PER_REQUEST
) -> SampleBatch:
    """Check a ``{"columns": {...}}`` body column by column; raise BadInput naming the problem.

    Checks run in a fixed order (shape, then seq, step, the float columns, series, then the
    rules across columns), so a body with several problems always gets the same message.
    """
    columns = _columns_of(payload)
    n = _sample_count(columns, max_samples)
    try:
        return _validated(columns, n)
    except BadInput as exc:
        # name every refused sample (the row rule the client checks with), so that a client
        # drops those and resends the rest instead of losing the whole batch
        rows = _refused_rows(columns, n)
        raise BadInput(str(exc), exc.status_code, rows or None) from None


def _refused_rows(columns: dict[str, list[Any]], n: int) -> list[int]:
    """The indices of the samples ``protocol.sample_problem`` refuses (absent columns read as
    null, ``series`` as "")."""
    filled = [
        columns.get(name) or ([""] * n if name == "series" else [None] * n)
        for name in protocol.SAMPLE_COLUMNS
    ]
    return [i for i, row in enumerate(zip(*filled, strict=True)) if protocol.sample_problem(row)]


def _validated(columns: dict[str, list[Any]], n: int) -> SampleBatch:
    found = _Found()
    out: dict[str, list[Any]] = {}
    for name in _INT_COLUMNS:
        out[name] = _check_int_column(name, columns[name], found)
    for name in FLOAT_COLUMNS:
        out[name] = _check_float_column(name, columns.get(name), n, found)
    out["series"] = _check_series(columns.get("series"), n, found)
    for name, (lowest, highest) in protocol.SAMPLE_RANGES.items():
        _check_range(name, out[name], found, lowest, highest)
    one_pair = n > 0 and {"b_small", "b_big"} <= found.uniform
    _check_batch_sizes(out["b_small"], out["b_big"], one_pair)
    for name in ("g_small_sq", "g_big_sq"):
        _check_squared_norm(name, out[name])
    g_sq_est, trace_sigma_est = _estimates(out, one_pair)
    return SampleBatch(
        n,
        out,
        g_sq_est,
        trace_sigma_est,
        frozenset(found.null),
        frozenset(found.uniform),
        frozenset(found.ascending),
    )


# --- shape -------------------------------------------------------------------------------------


def _columns_of(payload: Any) -> dict[str, list[Any]]:
    """The body's columns: a JSON object of known names, the required ones present, arrays."""
    if not isinstance(payload, dict) or not isinstance(payload.get("columns"), dict):
        raise BadInput('body must be a JSON object {"columns": {"seq": [...], "step": [...], ...}}')
    columns: dict[str, Any] = payload["columns"]
    unknown = sorted(set(columns) - set(protocol.SAMPLE_COLUMNS))
    if unknown:
        raise BadInput(
            f"unknown column(s) {', '.join(map(repr, unknown))}; "
            f"expected {', '.join(protocol.SAMPLE_COLUMNS)}"
        )
    missing = [c for c in protocol.REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise BadInput(f"missing required column(s): {', '.join(missing)}")
    for name, col in columns.items():
        if not isinstance(col, list):
            raise BadInput(f"column {name!r} must be a JSON array, got {type(col).__name__}")
    return columns


def _sample_count(columns: dict[str, list[Any]], max_samples: int) -> int:
    """The number of samples: within the limit (else 413), the same in every column."""
    n = len(columns["seq"])
    if n > max_samples:
        raise BadInput(
            f"too many samples in one request: {n} > {max_samples}; split the batch", 413
        )
    for name, col in columns.items():
        if len(col) != n:
            raise BadInput(
                f"column {name!r} has {len(col)} values but 'seq' has {n}; "
                "all columns must have the same length"
            )
    return n


# --- one column at a time ----------------------------------------------------------------------


def _first_bad(values: Sequence[Any], ok: Callable[[Any], bool]) -> int:
    return next(i for i, v in enumerate(values) if not ok(v))


def _is_finite(v: Any) -> bool:
    try:
        return v is None or math.isfinite(v)
    except OverflowError:  # an int too large for a double
        return False


def _is_uniform_number(col: list[Any]) -> bool:
    """Whether all elements equal the first, a number (later checks still vet its type)."""
    return type(col[0]) in _NUMBER_TYPES and col.count(col[0]) == len(col)


def _only_numbers_equal(value: Any) -> bool:
    """Whether ``value`` is a finite number other than 0 and 1.

    Elements equal to such a value are finite numbers too (no bool, null or string equals it),
    so a column of them needs no type or finiteness scan.
    """
    return type(value) in _NUMBER_TYPES and _is_finite(value) and value not in (0, 1)


def _check_int_column(name: str, col: list[Any], found: _Found) -> list[Any]:
    """Integers in [0, 2^63-1] (seq, step)."""
    if not col:
        return col
    if set(map(type, col)) != {int}:
        i = _first_bad(col, lambda v: type(v) is int)
        raise BadInput(f"column {name!r}[{i}] must be an integer, got {col[i]!r:.40}")
    if col == sorted(col):  # the usual order: then the ends are the extremes
        found.ascending.add(name)
        lowest, highest = col[0], col[-1]
    else:
        lowest, highest = min(col), max(col)
    if lowest < 0 or highest > _INT64_MAX:
        i = _first_bad(col, lambda v: 0 <= v <= _INT64_MAX)
        raise BadInput(f"column {name!r}[{i}] = {col[i]} is out of range [0, 2^63-1]")
    return col


def _check_float_column(name: str, col: list[Any] | None, n: int, found: _Found) -> list[Any]:
    """Finite numbers (or nulls where the wire allows them); an absent column is all null."""
    if col is None:
        if n:
            found.null.add(name)
        return [None] * n
    if name in _USUALLY_UNIFORM_COLUMNS and n and _is_uniform_number(col):
        found.uniform.add(name)
        if _only_numbers_equal(col[0]):  # then every element is a number equal to it
            return col
    nullable = name in protocol.NULLABLE_COLUMNS
    allowed = _NULLABLE_NUMBER_TYPES if nullable else _NUMBER_TYPES
    kinds = set(map(type, col))
    if not kinds <= allowed:
        i = _first_bad(col, lambda v: type(v) in allowed)
        what = "a number or null" if nullable else "a number"
        raise BadInput(f"column {name!r}[{i}] must be {what}, got {col[i]!r:.40}")
    if type(None) in kinds:
        found.null.add(name)
        values = [v for v in col if v is not None]
    else:
        values = col
    _check_finite(name, col, values)
    if name in _ORDERED_FLOAT_COLUMNS and values is col and col == sorted(col):
        found.ascending.add(name)
    return col


def _check_finite(name: str, col: list[Any], values: list[Any]) -> None:
    """One ``sum`` proves a whole column finite (any inf/nan makes the sum non-finite)."""
    if _is_finite(sum(values) if values else 0.0):
        return
    bad = [i for i, v in enumerate(col) if not _is_finite(v)]
    if bad:  # else: finite values whose sum merely overflowed
        raise BadInput(
            f"column {name!r}[{bad[0]}] must be a finite number, got {col[bad[0]]!r:.40}"
        )


def _check_range(name: str, col: list[Any], found: _Found, lowest: float, highest: float) -> None:
    """Finite values (checked before) within ``[lowest, highest]`` (``protocol.SAMPLE_RANGES``),
    so that the sums and differences the reads take of them stay floats."""
    values = col[:1] if name in found.uniform else col
    if name in found.null:
        values = [v for v in values if v is not None]
    if values and (min(values) < lowest or max(values) > highest):
        i = _first_bad(col, lambda v: v is None or lowest <= v <= highest)
        raise BadInput(
            f"column {name!r}[{i}] = {col[i]!r:.40} is outside [{lowest:.4g}, {highest:.4g}] "
            f"({_RANGE_WHY[name]})"
        )


def _check_series(series: list[Any] | None, n: int, found: _Found) -> list[Any]:
    """Strings of at most ``protocol.MAX_NAME_LENGTH`` characters without NUL; absent: ``""``."""
    if series is None:
        found.uniform.add("series")
        return [""] * n
    # One series per request is the usual case: then check its one value only.
    if n and type(series[0]) is str and series.count(series[0]) == n:
        found.uniform.add("series")
        checked = series[:1]
    else:
        checked = series
    if n and set(map(type, checked)) != {str}:
        i = _first_bad(series, lambda v: type(v) is str)
        raise BadInput(f"column 'series'[{i}] must be a string, got {series[i]!r:.40}")
    if n and max(map(len, checked)) > protocol.MAX_NAME_LENGTH:
        i = _first_bad(series, lambda v: len(v) <= protocol.MAX_NAME_LENGTH)
        raise BadInput(f"column 'series'[{i}] is longer than {protocol.MAX_NAME_LENGTH} characters")
    if n and "\x00" in "".join(checked):  # PostgreSQL text cannot hold U+0000
        i = _first_bad(series, lambda v: "\x00" not in v)
        raise BadInput(f"column 'series'[{i}] must not contain NUL (U+0000) characters")
    return series


# --- rules across columns ----------------------------------------------------------------------


def _check_batch_sizes(b_small: list[Any], b_big: list[Any], one_pair: bool) -> None:
    """Every sample's pair of batch sizes suits the two-batch estimator (estimators' rule)."""
    # Batch sizes rarely change within a request: check each distinct pair once.
    pairs = {(b_small[0], b_big[0])} if one_pair else set(zip(b_small, b_big, strict=True))
    if all(two_batch_sizes_ok(bs, bb) for bs, bb in pairs):
        return
    i = next(i for i in range(len(b_small)) if not two_batch_sizes_ok(b_small[i], b_big[i]))
    raise BadInput(
        f"sample {i}: need 0 < b_small < b_big, got b_small={b_small[i]}, b_big={b_big[i]} "
        "(the two batch sizes of the two-batch estimator must differ)"
    )


def _check_squared_norm(name: str, col: list[Any]) -> None:
    if col and min(col) < 0:
        i = _first_bad(col, lambda v: v >= 0)
        raise BadInput(f"column {name!r}[{i}] = {col[i]} is negative; squared norms are >= 0")


def _estimates(out: dict[str, list[Any]], one_pair: bool) -> tuple[list[float], list[float]]:
    """The per-sample |𝒢|^2 and 𝒮 columns; BadInput if their sums overflow a double."""
    b_small, b_big = out["b_small"], out["b_big"]
    if one_pair:
        g_sq_est, trace_sigma_est = two_batch_estimate_columns(
            b_small[0], b_big[0], out["g_small_sq"], out["g_big_sq"]
        )
    else:
        pair_estimates = list(
            map(two_batch_estimates, b_small, b_big, out["g_small_sq"], out["g_big_sq"])
        )
        g_sq_est = [e[0] for e in pair_estimates]
        trace_sigma_est = [e[1] for e in pair_estimates]
    limit = protocol.MAX_SUMMED
    for estimate in (g_sq_est, trace_sigma_est):
        if not estimate:  # an empty body: nothing to check (min() of nothing raises)
            continue
        # one sum finds a nan or an inf (min and max skip a nan), min and max the magnitude
        in_range = _is_finite(sum(estimate)) and -limit <= min(estimate) <= max(estimate) <= limit
        if not in_range:
            i = _first_bad(estimate, lambda v: -limit <= v <= limit)  # inf and nan fail too
            raise BadInput(
                f"the squared norms are too large: sample {i}'s |G|^2 or tr(Sigma) estimate "
                f"is {_SUMMED_RULE}"
            )
    return g_sq_est, trace_sigma_est


# --- a branch run's plan ---------------------------------------------------------------------


def _integer(value: Any) -> bool:
    return type(value) is int


#: The fields of a branch run's plan (``config["branch"]``, written by ``noisescope.branch``):
#: each with its rule and the words for it. The branch reader feeds them into maths that
#: refuses values outside these rules, so they are checked where they are written.
_BRANCH_PLAN_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "epsilon": (
        lambda v: epsilon_problem(v) is None,
        "a positive relative tolerance (a finite number > 0, e.g. 0.01)",
    ),
    "seed": (_integer, "an integer"),
    "multiplier": (lambda v: _integer(v) and v >= 1, "an integer >= 1"),
    "budget": (lambda v: _integer(v) and v >= 1, "an integer >= 1 (examples or tokens)"),
    "step": (lambda v: _integer(v) and v >= 0, "an integer >= 0"),
    "lr": (
        lambda v: type(v) in _NUMBER_TYPES and _is_finite(v) and v > 0,
        "a finite number > 0",
    ),
    "parent_run_id": (lambda v: protocol.run_id_problem(v) is None, "a valid run id"),
}


def branch_plan_problem(config: dict[str, Any]) -> str | None:
    """Why a run config's ``branch`` object is no branch plan, naming the field, or None.

    A field that is absent or null is not given (the reader's default applies); a ``branch``
    that is no object is an ordinary config value (a git branch's name, say)."""
    plan = config.get("branch")
    if not isinstance(plan, dict):
        return None
    for name, (ok, rule) in _BRANCH_PLAN_FIELDS.items():
        value = plan.get(name)
        if value is not None and not ok(value):
            return f"config.branch.{name} must be {rule}, got {value!r:.40}"
    return None
