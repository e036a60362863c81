"""Bad input gets a 4xx whose ``detail`` names the problem, never a 5xx, and stores nothing.

The module's server runs with a 1 MiB body limit and 10 000 samples per request.
"""

from __future__ import annotations

import gzip
import json
import uuid
from collections.abc import Mapping
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from harness import AppServer, columns, run_body

API = "/api/v1"


@pytest.fixture(scope="module")
def target(server: AppServer) -> str:
    """One run with 20 stored samples that every bad request aims at."""
    rid = uuid.uuid4().hex
    with server.client() as c:
        assert c.put(f"{API}/runs/{rid}", json=run_body()).status_code == 201
        r = c.post(f"{API}/runs/{rid}/samples", json={"columns": columns(20)})
        assert r.json()["inserted"] == 20
    return rid


def _with(**changes: Any) -> bytes:
    cols = columns(5, start=1000)
    cols.update(changes)
    return orjson.dumps({"columns": cols})


def _raw(text: str) -> bytes:
    return text.encode()


GOOD = columns(5, start=1000)
BAD_SAMPLES: list[tuple[str, bytes, dict[str, str], int, str]] = [
    ("malformed json", b'{"columns": {', {}, 400, "not valid JSON"),
    ("empty body", b"", {}, 400, "empty"),
    ("array body", b"[1, 2]", {}, 422, "JSON object"),
    ("no columns key", b'{"cols": {}}', {}, 422, "columns"),
    ("column not an array", _with(seq=5), {}, 422, "'seq' must be a JSON array"),
    ("string in seq", _with(seq=[0, 1, "2", 3, 4]), {}, 422, "'seq'[2]"),
    ("bool in step", _with(step=[0, 1, True, 3, 4]), {}, 422, "'step'[2]"),
    ("float step", _with(step=[0, 1.5, 2, 3, 4]), {}, 422, "'step'[1]"),
    ("NaN literal", _raw('{"columns": {"seq": [NaN]}}'), {}, 400, "NaN"),
    ("overflowing number", _raw('{"columns": {"seq": [1e400]}}'), {}, 400, "JSON"),
    ("negative seq", _with(seq=[-1, 1, 2, 3, 4]), {}, 422, "out of range"),
    ("seq beyond int64", _with(seq=[2**64 - 1, 1, 2, 3, 4]), {}, 422, "out of range"),
    ("zero b_small", _with(b_small=[0, 8, 8, 8, 8]), {}, 422, "0 < b_small < b_big"),
    ("negative b_big", _with(b_big=[-32, 32, 32, 32, 32]), {}, 422, "0 < b_small < b_big"),
    ("b_small == b_big", _with(b_small=[32] * 5), {}, 422, "must differ"),
    ("b_small > b_big", _with(b_small=[64] * 5), {}, 422, "0 < b_small < b_big"),
    ("length mismatch", _with(loss=[1.0, 2.0]), {}, 422, "same length"),
    ("missing column", orjson.dumps({"columns": {"seq": [1]}}), {}, 422, "missing required"),
    ("unknown column", _with(gradient=[1] * 5), {}, 422, "unknown column"),
    ("null in required", _with(g_big_sq=[1.0, None, 1.0, 1.0, 1.0]), {}, 422, "'g_big_sq'[1]"),
    ("string loss", _with(loss=[1.0, "x", 1.0, 1.0, 1.0]), {}, 422, "'loss'[1]"),
    ("negative norm", _with(g_small_sq=[1.0, -1.0, 1.0, 1.0, 1.0]), {}, 422, "negative"),
    ("series not string", _with(series=["", 3, "", "", ""]), {}, 422, "'series'[1]"),
    ("series too long", _with(series=["x" * 201] * 5), {}, 422, "longer than"),
    ("overflowing estimate", _with(g_big_sq=[1e308] * 5), {}, 422, "too large"),
    ("estimate beyond what is summed", _with(g_big_sq=[1e300] * 5), {}, 422, "MAX_SUMMED"),
    ("loss beyond what is summed, one value", _with(loss=[1e307] * 5), {}, 422, "MAX_SUMMED"),
    ("loss beyond what is summed", _with(loss=[1.0, 1e307, 1.0, 1.0, 1.0]), {}, 422, "'loss'[1]"),
    ("lr beyond what is summed", _with(lr=[-1e300] * 5), {}, 422, "'lr'[0] = -1e+300 is outside"),
    ("negative examples", _with(examples=[0.0, 1.0, -1.0, 3.0, 4.0]), {}, 422, "'examples'[2]"),
    ("time past 9999", _with(time=[1.7e308] * 5), {}, 422, "'time'[0] = 1.7e+308 is outside"),
    ("time before year 1", _with(time=[-1e12, 0.0, 1.0, 2.0, 3.0]), {}, 422, "TIME_RANGE"),
    (
        "too many samples",
        orjson.dumps({"columns": columns(10_001)}),
        {},
        413,
        "10000",
    ),
    ("body too large", b'{"columns": {"seq": [' + b"0," * 600_000 + b"0]}}", {}, 413, "limit"),
    (
        "gzip bomb",
        gzip.compress(b'{"columns": {"seq": [' + b" " * (50 << 20) + b"]}}"),
        {"Content-Encoding": "gzip"},
        413,
        "decompressed",
    ),
    ("corrupt gzip", b"\x1f\x8b\x08\x00garbage", {"Content-Encoding": "gzip"}, 400, "gzip"),
    ("truncated gzip", gzip.compress(_with())[:40], {"Content-Encoding": "gzip"}, 400, "gzip"),
    ("unknown encoding", _with(), {"Content-Encoding": "br"}, 415, "Content-Encoding"),
]


@pytest.mark.parametrize(
    ("body", "headers", "status", "needle"),
    [pytest.param(b, h, s, n, id=name) for name, b, h, s, n in BAD_SAMPLES],
)
def test_bad_samples_are_rejected_with_a_reason(
    client: TestClient,
    target: str,
    body: bytes,
    headers: dict[str, str],
    status: int,
    needle: str,
) -> None:
    r = client.post(f"{API}/runs/{target}/samples", content=body, headers=headers)
    assert r.status_code == status, r.text
    assert needle in r.json()["detail"]
    assert client.get(f"{API}/runs/{target}").json()["n_samples"] == 20


def test_a_bad_batch_stores_nothing_even_when_most_of_it_is_valid(
    client: TestClient, target: str
) -> None:
    cols = columns(500, start=5000)
    cols["b_big"][499] = cols["b_small"][499]  # only the last sample is bad
    r = client.post(f"{API}/runs/{target}/samples", json={"columns": cols})
    assert r.status_code == 422
    assert "sample 499" in r.json()["detail"]
    assert client.get(f"{API}/runs/{target}").json()["n_samples"] == 20


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        pytest.param(
            b'{"project": "p", "task": "t", "batch_size": "big"}', 422, "batch_size", id="type"
        ),
        pytest.param(b'{"project": "p", "task": "t", "config": {"x": NaN}}', 400, "NaN", id="nan"),
        pytest.param(
            b'{"project": "p", "task": "t", "batch_size": -1}', 422, "batch_size", id="neg"
        ),
        pytest.param(
            b'{"project": "p", "task": "t", "batch_size": 0}', 422, "batch_size", id="zero"
        ),
        pytest.param(b'{"project": "p", "task": "t", "colour": 1}', 422, "colour", id="extra"),
        pytest.param(b'{"task": "t"}', 422, "project", id="missing"),
        pytest.param(b'{"project": "", "task": "t"}', 422, "project", id="empty"),
        pytest.param(b'{"project": "p", "task": "t", "units": "bytes"}', 422, "units", id="units"),
        pytest.param(b'{"project": "p", "task": "t", "tags": "a"}', 422, "tags", id="tags"),
        pytest.param(
            b'{"project": "p", "task": "t", "started_at": "soon"}', 422, "started_at", id="time"
        ),
        pytest.param(b'{"project": "' + b"p" * 300 + b'", "task": "t"}', 422, "project", id="long"),
    ],
)
def test_bad_run_bodies(client: TestClient, body: bytes, status: int, needle: str) -> None:
    r = client.put(f"{API}/runs/{uuid.uuid4().hex}", content=body)
    assert r.status_code == status, r.text
    assert needle in r.json()["detail"]


@pytest.mark.parametrize("bad_id", ["a%20b", "x" * 65, "%C3%A9t%C3%A9"])
def test_bad_run_ids(client: TestClient, bad_id: str) -> None:
    r = client.put(f"{API}/runs/{bad_id}", json=run_body())
    assert r.status_code == 422
    assert "run id" in r.json()["detail"]


@pytest.mark.parametrize(
    "body",
    [
        b'{"events": [{"step": "x", "kind": "m"}]}',
        b'{"events": [{"step": 1}]}',
        b'{"events": [{"step": -1, "kind": "m"}]}',
        b'{"events": {"step": 1}}',
        b'{"events": [{"step": 1, "kind": "m", "time": 1.7e308}]}',
    ],
)
def test_bad_events(client: TestClient, target: str, body: bytes) -> None:
    r = client.post(f"{API}/runs/{target}/events", content=body)
    assert r.status_code == 422, r.text
    assert r.json()["detail"]


def test_bad_query_parameters(client: TestClient, target: str) -> None:
    assert client.get(f"{API}/runs/{target}/series", params={"max_points": 0}).status_code == 422
    assert client.get(f"{API}/runs", params={"limit": "many"}).status_code == 422
    params: Mapping[str, str | float]
    for params in ({"targets": "nan"}, {"targets": "inf"}, {"targets": "x"}, {"loss": "both"}):
        r = client.get(f"{API}/tasks/p/t/critical-batch", params=params)
        assert r.status_code == 422, (params, r.text)
        assert r.json()["detail"]
    r = client.get(f"{API}/tasks/no-project/no-task/critical-batch")
    assert r.status_code == 404 and "does not exist" in r.json()["detail"]
    assert client.get(f"{API}/series").status_code == 422  # runs= is required
    r = client.get(f"{API}/series", params={"runs": [f"r{i}" for i in range(201)]})
    assert r.status_code == 422
    assert client.get(f"{API}/series", params={"runs": ["nope"]}).json() == []
    bad_plans: tuple[Mapping[str, str | float], ...] = (
        {"b_crit": -1, "per_device_batch": 8},
        {"b_crit": 100, "per_device_batch": 0},
        {"b_crit": 100, "per_device_batch": 8, "min_speedup": 2.5},
        {"b_crit": 100, "per_device_batch": 8, "max_devices": 0},
        {"b_crit": "1e400", "per_device_batch": 8},
    )
    for params in bad_plans:
        r = client.get(f"{API}/parallelism", params=params)
        assert r.status_code == 422, (params, r.text)
    # units: the values a run's units take (protocol.UNITS), named in the refusal
    r = client.get(
        f"{API}/parallelism", params={"b_crit": 100, "per_device_batch": 8, "units": "bytes"}
    )
    assert r.status_code == 422 and "'examples' or 'tokens'" in r.json()["detail"], r.text
    r = client.get(f"{API}/runs/{target}/series", params={"window": -5})
    assert r.status_code == 422


@pytest.mark.parametrize(
    "params",
    [
        {"b_crit": 1e18, "per_device_batch": 1e-3},
        {"b_crit": 1000, "per_device_batch": 1, "min_speedup": 1.0000000000000002},
    ],
)
def test_a_device_limit_beyond_2_24_is_an_answer_not_a_refusal(
    client: TestClient, params: dict[str, float]
) -> None:
    """Issue 29 item 7: the plan's derived max_devices (4x the limit) was refused as if the
    caller had sent it ('max_devices must be between 1 and 16777216, got 9223372036854775808')."""
    r = client.get(f"{API}/parallelism", params=params)
    assert r.status_code == 200, r.text
    plan = r.json()
    assert plan["rows"][-1]["devices"] == 2**24
    assert "beyond 2^24 (16,777,216) devices" in plan["summary"], plan["summary"]


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"b_crit": 1e18, "per_device_batch": 5e-324}, "per_device_batch"),
        ({"b_crit": 5e-324, "per_device_batch": 1}, "b_crit"),
        ({"b_crit": 100, "per_device_batch": 1, "batch_size": 5e-324}, "batch_size"),
    ],
)
def test_parallelism_inputs_outside_their_range_are_refused_by_name(
    client: TestClient, params: dict[str, float], named: str
) -> None:
    """Issue 29 item 6: 5e-324 per device overflowed to an infinite device count, a 422 that
    blamed the database ('cannot convert float infinity to integer')."""
    r = client.get(f"{API}/parallelism", params=params)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert named in detail and "0.000001" in detail and "database" not in detail, detail


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_column_maps = st.dictionaries(
    st.sampled_from([*GOOD.keys(), "junk"]), st.lists(_json_values, max_size=4), max_size=11
)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(payload=st.one_of(_json_values, st.builds(lambda c: {"columns": c}, _column_maps)))
def test_fuzzed_bodies_never_cause_a_5xx(client: TestClient, target: str, payload: Any) -> None:
    r = client.post(f"{API}/runs/{target}/samples", content=json.dumps(payload).encode())
    assert r.status_code < 500, r.text


@pytest.mark.parametrize("length", [201, 50_001, 60_000])
def test_a_search_longer_than_any_name_is_refused_with_the_limit(
    client: TestClient, length: int
) -> None:
    """SQLite refuses LIKE patterns over 50 000 bytes (it was a 503 "retry"): the limit is the
    longest name, on both backends."""
    r = client.get(f"{API}/runs", params={"search": "x" * length})
    assert r.status_code == 422, r.text
    assert "search" in r.json()["detail"] and "200 characters" in r.json()["detail"]
    assert client.get(f"{API}/runs", params={"search": "x" * 200}).status_code == 200


@pytest.mark.parametrize("when", ["9999-12-31T23:00:00-14:00", "0001-01-01T00:00:00+14:00"])
def test_a_time_beyond_the_utc_calendar_is_refused_by_name(
    client: TestClient, target: str, when: str
) -> None:
    """Issue 29 item 6: valid ISO 8601 whose offset carries it past 9999 or before year 1 in
    UTC was a 422 blaming the database ('date value out of range'); nothing changes."""
    before = client.get(f"{API}/runs/{target}").json()
    r = client.patch(f"{API}/runs/{target}", json={"ended_at": when, "status": "finished"})
    assert r.status_code == 422 and "ended_at" in r.json()["detail"], r.text
    assert "0001-01-01 to 9999-12-31 in UTC" in r.json()["detail"]
    assert client.get(f"{API}/runs/{target}").json() == before
    rid = uuid.uuid4().hex
    r = client.put(f"{API}/runs/{rid}", json=run_body(started_at=when))
    assert r.status_code == 422 and "started_at" in r.json()["detail"], r.text
    assert client.get(f"{API}/runs/{rid}").status_code == 404
