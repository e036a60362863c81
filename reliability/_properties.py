"""Property-based checks (hypothesis) of the payload validation the server runs on every
request: ``validate.validate_samples`` (columnar samples) and the pydantic body models.

- any JSON-like payload is either accepted with every invariant holding, or rejected with
  ``BadInput`` (a 4xx): never another exception (which would be a 5xx);
- valid batches are always accepted, with the estimates of ``noisescope.estimators``;
- one bad element anywhere in a valid batch gets it rejected, naming that column.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from noisescope import _wire
from noisescope.estimators import two_batch_estimates

INT_COLUMNS = ("seq", "step")
REQUIRED_FLOATS = ("b_small", "b_big", "g_small_sq", "g_big_sq")
NULLABLE_FLOATS = ("examples", "loss", "lr", "time")
BAD_VALUES: dict[str, list[Any]] = {
    "int": [1.5, "1", None, -1, 2**64, True, float("nan"), [], {}],
    "float": [float("nan"), float("inf"), -float("inf"), "x", None, True, [], {}, -1.0],
    "nullable": [float("nan"), float("inf"), "x", True, [], {}],
    "series": [3, None, "s" * (_wire.MAX_NAME_LENGTH + 1), "a\x00b", True],
}

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=20,
)


def _in_range(column: str) -> st.SearchStrategy[float]:
    """Finite values the server accepts in ``column`` (``_wire.SAMPLE_RANGES``), at most 1e12."""
    lowest, highest = _wire.SAMPLE_RANGES[column]
    return st.floats(max(lowest, -1e12), min(highest, 1e12))


@st.composite
def valid_columns(draw: st.DrawFn) -> dict[str, list[Any]]:
    n = draw(st.integers(0, 40))
    b_small = draw(st.lists(st.floats(1e-3, 1e6), min_size=n, max_size=n))
    ratio = draw(st.lists(st.floats(1.01, 1e3), min_size=n, max_size=n))
    norm = st.floats(0.0, 1e6)
    cols: dict[str, list[Any]] = {
        "seq": draw(st.lists(st.integers(0, 2**63 - 1), min_size=n, max_size=n, unique=True)),
        "step": draw(st.lists(st.integers(0, 2**63 - 1), min_size=n, max_size=n)),
        "b_small": b_small,
        "b_big": [b * r for b, r in zip(b_small, ratio, strict=True)],
        "g_small_sq": draw(st.lists(norm, min_size=n, max_size=n)),
        "g_big_sq": draw(st.lists(norm, min_size=n, max_size=n)),
    }
    for name in NULLABLE_FLOATS:
        if draw(st.booleans()):
            cols[name] = draw(st.lists(st.none() | _in_range(name), min_size=n, max_size=n))
    if draw(st.booleans()):
        cols["series"] = draw(st.lists(st.text(max_size=20).filter(lambda s: "\x00" not in s),
                                       min_size=n, max_size=n))  # fmt: skip
    return cols


def _kind(column: str) -> str:
    if column in INT_COLUMNS:
        return "int"
    if column in REQUIRED_FLOATS:
        return "float"
    return "series" if column == "series" else "nullable"


def _invariants(batch: Any) -> None:
    cols = batch.columns
    assert all(len(cols[c]) == batch.n for c in _wire.SAMPLE_COLUMNS)
    for c in INT_COLUMNS:
        assert all(type(v) is int and 0 <= v < 2**63 for v in cols[c])
    for c in (*REQUIRED_FLOATS, *NULLABLE_FLOATS):
        assert all(v is None or math.isfinite(v) for v in cols[c])
    assert all(
        b_big > b_small > 0 for b_small, b_big in zip(cols["b_small"], cols["b_big"], strict=True)
    )
    assert all(math.isfinite(g) for g in [*batch.g_sq_est, *batch.trace_sigma_est])


@dataclass
class PropertyResult:
    name: str
    examples: int
    ok: bool
    error: str = ""


def _run(name: str, test: Any, examples: int) -> PropertyResult:
    wrapped = settings(max_examples=examples, deadline=None, database=None,
                       suppress_health_check=list(HealthCheck))(test)  # fmt: skip
    try:
        wrapped()
    except Exception as exc:
        return PropertyResult(name, examples, False, f"{type(exc).__name__}: {exc}"[:500])
    return PropertyResult(name, examples, True)


def run_properties(examples: int) -> list[PropertyResult]:
    from noisescope_server.errors import BadInput
    from noisescope_server.validate import validate_samples

    @given(payload=st.one_of(_json, st.builds(lambda c: {"columns": c}, st.dictionaries(
        st.sampled_from([*_wire.SAMPLE_COLUMNS, "junk"]), st.lists(_json, max_size=5),
        max_size=12))))  # fmt: skip
    def any_payload_is_accepted_whole_or_rejected_as_bad_input(payload: Any) -> None:
        try:
            batch = validate_samples(payload)
        except BadInput as exc:
            message = str(exc)
        else:
            _invariants(batch)
            return
        assert message, "a rejection must say what is wrong"

    @given(cols=valid_columns())
    def valid_batches_are_accepted_with_the_estimator_values(cols: dict[str, list[Any]]) -> None:
        batch = validate_samples({"columns": cols})
        assert batch.n == len(cols["seq"])
        _invariants(batch)
        for i in range(batch.n):
            g_sq, trace_sigma = two_batch_estimates(
                cols["b_small"][i], cols["b_big"][i], cols["g_small_sq"][i], cols["g_big_sq"][i]
            )
            assert batch.g_sq_est[i] == g_sq and batch.trace_sigma_est[i] == trace_sigma

    @given(cols=valid_columns().filter(lambda c: len(c["seq"]) > 0), data=st.data())
    def one_bad_element_rejects_the_batch_naming_its_column(
        cols: dict[str, list[Any]], data: st.DataObject
    ) -> None:
        column = data.draw(st.sampled_from(_wire.SAMPLE_COLUMNS))
        n = len(cols["seq"])
        cols.setdefault(column, [None] * n if column != "series" else [""] * n)
        index = data.draw(st.integers(0, n - 1))
        cols[column][index] = data.draw(st.sampled_from(BAD_VALUES[_kind(column)]))
        try:
            validate_samples({"columns": cols})
        except BadInput as exc:
            message = str(exc)
        else:
            raise AssertionError(f"accepted a bad {column!r} value {cols[column][index]!r}")
        assert column in message, (column, message)

    @given(body=st.dictionaries(st.sampled_from(["project", "task", "name", "config", "tags",
           "batch_size", "units", "status", "started_at", "x"]), _json, max_size=9))  # fmt: skip
    def run_bodies_validate_or_fail_cleanly(body: dict[str, Any]) -> None:
        from pydantic import ValidationError

        from noisescope_server.api.schemas import RunPut

        try:
            run = RunPut.model_validate(body)
        except ValidationError:
            return
        assert run.project and run.task and "\x00" not in run.project + run.task + run.name
        assert run.batch_size is None or run.batch_size > 0

    tests = [
        any_payload_is_accepted_whole_or_rejected_as_bad_input,
        valid_batches_are_accepted_with_the_estimator_values,
        one_bad_element_rejects_the_batch_naming_its_column,
        run_bodies_validate_or_fail_cleanly,
    ]
    return [_run(t.__name__.replace("_", " "), t, examples) for t in tests]
