"""The one sample schema: every form of it derives from ``noisescope.protocol.SAMPLE_FIELDS``
or is checked against it, and each check fails when its form drifts from the table
(DEVELOPERS.md, adding a sample field)."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import noisescope
from harness.payloads import columns, log_sample_args
from noisescope import _records, _sink, protocol
from noisescope.recommend import NoiseTracker
from noisescope_server import models, validate
from noisescope_server.api import schemas
from noisescope_server.crud import _samples, _sql

FIELDS = protocol.SAMPLE_FIELDS
#: The table with one more logged field (what a developer adds first, before the forms).
DRIFTED = (
    *FIELDS,
    protocol.SampleField(
        "grad_norm", float, "|G|", nullable=True, range=(0.0, 1.0), range_why="why",
        blocks=(("grad_norm_max", "max"),),
    ),
)  # fmt: skip


def test_the_wire_forms_are_the_tables() -> None:
    wire = [f for f in FIELDS if f.wire]
    assert tuple(f.name for f in wire) == protocol.SAMPLE_COLUMNS
    assert tuple(f.name for f in wire if f.required) == protocol.REQUIRED_COLUMNS
    assert tuple(f.name for f in wire if f.nullable) == protocol.NULLABLE_COLUMNS
    assert {f.name: f.range for f in FIELDS if f.range} == protocol.SAMPLE_RANGES
    assert tuple(f.name for f in FIELDS) == protocol.READ_COLUMNS  # what a sample reads as
    stored = tuple("series_id" if f.name == "series" else f.name for f in wire)
    assert stored == models.SAMPLE_COLUMNS
    assert tuple(f.name for f in wire if f.type is float) == validate.FLOAT_COLUMNS
    body = schemas.SAMPLES_BODY_SCHEMA["properties"]["columns"]
    assert tuple(body["properties"]) == protocol.SAMPLE_COLUMNS
    assert tuple(body["required"]) == protocol.REQUIRED_COLUMNS
    assert set(columns(3)) == set(protocol.SAMPLE_COLUMNS)  # the tests' sample columns


def test_the_client_sample_is_checked_against_the_table() -> None:
    assert not _records.sample_problems()
    assert _records.sample_problems(DRIFTED)
    time = next(f for f in FIELDS if f.name == "time")
    retyped = tuple(dataclasses.replace(f, type=int) if f is time else f for f in FIELDS)
    assert _records.sample_problems(retyped) == [
        "SampleRow.time is <class 'float'>, the table says <class 'int'>"
    ]


def test_the_stored_tables_are_checked_against_the_table() -> None:
    assert not models.table_problems()
    problems = models.table_problems(DRIFTED)
    assert len(problems) == 2  # Sample and SampleBlock both lack the new field
    assert all("grad_norm" in p for p in problems)


def test_the_block_sums_have_one_column_per_aggregate() -> None:
    aggregates = [(c, how) for f in FIELDS for c, how in f.blocks]
    assert ("series_id", "block", *(c for c, _ in aggregates)) == _sql.BLOCK_COLUMNS
    for dialect in _sql.DIALECTS:
        sets = _sql.BLOCK_ADD[dialect].partition("DO UPDATE SET ")[2]
        for column, _ in aggregates:
            assert f"{column} = " in sets, (dialect, column)
        assert sets.count(" = ") == len(aggregates), sets
        sets = _sql.BLOCK_SET[dialect].partition("DO UPDATE SET ")[2]
        assert all(f"{column} = excluded.{column}" in sets for column, _ in aggregates)
    batch = validate.validate_samples({"columns": columns(200)})
    rows = _samples.block_deltas(batch, {"": 0})
    assert rows is not None
    assert {len(row) for row in rows} == {len(_sql.BLOCK_COLUMNS)}


def _hints(func: Callable[..., Any]) -> dict[str, Any]:
    return typing.get_type_hints(func)


def _signature_problems(func: Callable[..., Any], fields: tuple[Any, ...]) -> list[str]:
    """Where a ``log_sample`` signature differs from the table's logged fields."""
    logged = [f for f in fields if f.logged]
    params = [p for p in inspect.signature(func).parameters.values() if p.name != "self"]
    positional = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    keyword = {p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY}
    problems = []
    if positional != [f.name for f in logged if f.required]:
        problems.append(f"{func.__qualname__}: positional {positional}")
    if keyword != {f.name: f.default for f in logged if not f.required}:
        problems.append(f"{func.__qualname__}: keywords {keyword}")
    hints = _hints(func)
    for f in logged:
        want = f.type | None if f.nullable else f.type
        if hints.get(f.name) != want:
            problems.append(f"{func.__qualname__}: {f.name} is {hints.get(f.name)}")
    return problems


LOG_SAMPLES = [noisescope.Run.log_sample, _sink.Sink.log_sample]


@pytest.mark.parametrize("func", LOG_SAMPLES, ids=lambda f: f.__qualname__)
def test_every_log_sample_signature_is_the_tables(func: Callable[..., Any]) -> None:
    """Written out for speed (the hot path), checked here."""
    assert not _signature_problems(func, FIELDS)
    assert _signature_problems(func, DRIFTED)


def test_the_tracker_passes_every_field_on_unread() -> None:
    """``NoiseTracker`` names only the positional fields it reads; the keyword fields reach
    its run as given, so a new field needs no change there."""
    params = list(inspect.signature(NoiseTracker.log_sample).parameters.values())[1:]
    required = [f.name for f in FIELDS if f.logged and f.required]
    assert [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD] == required
    assert params[-1].kind is inspect.Parameter.VAR_KEYWORD

    class Collect:
        def __init__(self) -> None:
            self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

        def log_sample(self, *args: Any, **kw: Any) -> None:
            self.calls.append((args, kw))

    run = Collect()
    keyword = {f.name: f"value of {f.name}" for f in DRIFTED if f.logged and not f.required}
    NoiseTracker(run).log_sample(3, 1.0, 2.0, 3.0, 4.0, **keyword)
    assert run.calls == [((3, 1.0, 2.0, 3.0, 4.0), keyword)]


def test_the_tests_logging_helper_follows_the_table() -> None:
    cols = columns(3)
    assert log_sample_args(cols, 1) == tuple(cols[n][1] for n in protocol.LOGGED_POSITIONAL)


def test_log_sample_fills_every_field_of_its_record(tmp_path: Path) -> None:
    """The open record ``Run.log_sample`` builds, and updates in place, holds each argument
    in the ``Sample`` field of its name (the list is written out for speed)."""
    run = noisescope.init(project="p", mode="offline", dir=tmp_path)
    committed: list[list[Any]] = []
    run._commit_records = lambda records: committed.extend(list(r) for r in records)
    try:
        first: dict[str, Any] = {"step": 3, "b_small": 1.0, "b_big": 2.0, "g_small_sq": 3.0}
        first["g_big_sq"] = 4.0
        first |= {"examples": 5.0, "series": "", "loss": 6.0, "lr": 7.0}
        positional: list[Any] = [first[n] for n in protocol.LOGGED_POSITIONAL]
        run.log_sample(*positional, **{n: first[n] for n in protocol.LOGGED_KEYWORD})
        second = {
            name: value * 10 for name, value in first.items() if name not in ("step", "series")
        }
        positional = [first["step"], *(second[n] for n in protocol.LOGGED_POSITIONAL[1:])]
        keyword: dict[str, Any] = {n: second.get(n, first[n]) for n in protocol.LOGGED_KEYWORD}
        run.log_sample(*positional, **keyword)  # the same step and series: updated in place
        run.log_sample(4, 1.0, 2.0, 3.0, 4.0)  # the next step commits the first
    finally:
        run.finish()
    record = dict(zip(protocol.SAMPLE_COLUMNS[1:], committed[0], strict=True))
    for name in protocol.LOGGED_POSITIONAL + protocol.LOGGED_KEYWORD:
        assert record[name] == second.get(name, first[name]), name
    assert isinstance(record["time"], float)


def test_log_fills_the_nullable_logged_fields(tmp_path: Path) -> None:
    """``Run.log``'s step scalars are the nullable fields ``log_sample`` takes."""
    nullable = {f.name for f in FIELDS if f.logged and f.nullable}
    keyword = {n for n, p in inspect.signature(noisescope.Run.log).parameters.items()}
    assert nullable <= keyword
    run = noisescope.init(project="p", mode="offline", dir=tmp_path)
    committed: list[list[Any]] = []
    run._commit_records = lambda records: committed.extend(list(r) for r in records)
    try:
        run.log_sample(3, 1.0, 2.0, 3.0, 4.0)
        run.log(3, **dict.fromkeys(nullable, 0.5))
        run.log_sample(4, 1.0, 2.0, 3.0, 4.0)
    finally:
        run.finish()
    record = dict(zip(protocol.SAMPLE_COLUMNS[1:], committed[0], strict=True))
    assert {name: record[name] for name in nullable} == dict.fromkeys(nullable, 0.5)
