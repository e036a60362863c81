"""Run and event bodies follow the samples endpoint's one strict policy: nothing is coerced
(``true`` is not 1, ``"64"`` is not 64, ``"1"`` is not a step); integers are numbers, and times
may be ISO 8601 text or Unix seconds."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from starlette.testclient import TestClient

from harness import run_body

API = "/api/v1"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("batch_size", True),
        ("batch_size", "64"),
        ("project", 5),
        ("name", 1.5),
        ("tags", ["a", 1]),
        ("units", True),
        ("started_at", True),
    ],
)
def test_run_bodies_are_not_coerced(client: TestClient, field: str, value: Any) -> None:
    rid = uuid.uuid4().hex
    r = client.put(f"{API}/runs/{rid}", json=run_body(**{field: value}))
    assert r.status_code == 422, r.text
    assert field in r.json()["detail"]
    assert client.get(f"{API}/runs/{rid}").status_code == 404


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"batch_size": "64"}, "batch_size"),
        ({"batch_size": False}, "batch_size"),
        ({"status": 1}, "status"),
        ({"ended_at": True}, "ended_at"),
    ],
)
def test_patch_bodies_are_not_coerced(client: TestClient, body: object, field: str) -> None:
    rid = uuid.uuid4().hex
    client.put(f"{API}/runs/{rid}", json=run_body()).raise_for_status()
    r = client.patch(f"{API}/runs/{rid}", json=body)
    assert r.status_code == 422, r.text
    assert field in r.json()["detail"]
    assert client.get(f"{API}/runs/{rid}").json()["batch_size"] == 32


@pytest.mark.parametrize(
    ("event", "field"),
    [
        ({"step": "1", "kind": "m"}, "step"),
        ({"step": True, "kind": "m"}, "step"),
        ({"step": 1.0, "kind": "m"}, "step"),
        ({"step": 1, "kind": 7}, "kind"),
        ({"step": 1, "kind": "m", "seq": "3"}, "seq"),
        ({"step": 1, "kind": "m", "time": "12"}, "time"),
        ({"step": 1, "kind": "m", "time": True}, "time"),
    ],
)
def test_events_are_not_coerced(client: TestClient, event: object, field: str) -> None:
    rid = uuid.uuid4().hex
    client.put(f"{API}/runs/{rid}", json=run_body()).raise_for_status()
    r = client.post(f"{API}/runs/{rid}/events", json={"events": [event]})
    assert r.status_code == 422, r.text
    assert field in r.json()["detail"]
    assert client.get(f"{API}/runs/{rid}/events").json() == []


def test_integers_are_numbers_and_times_stay_lax(client: TestClient) -> None:
    rid = uuid.uuid4().hex
    body = run_body(batch_size=64, started_at="2026-01-02T03:04:05Z")
    assert client.put(f"{API}/runs/{rid}", json=body).status_code == 201
    run = client.get(f"{API}/runs/{rid}").json()
    assert run["batch_size"] == 64.0 and run["started_at"].startswith("2026-01-02T03:04:05")
    event = {"step": 2, "kind": "m", "time": 1_700_000_000, "payload": {"x": [1, {"y": 2}]}}
    r = client.post(f"{API}/runs/{rid}/events", json={"events": [event]})
    assert r.json() == {"received": 1, "inserted": 1}
    assert client.patch(f"{API}/runs/{rid}", json={"ended_at": 1_700_000_100}).status_code == 200


def test_bodies_map_field_for_field_onto_crud() -> None:
    """``PUT /runs/{id}`` builds ``crud.RunIn`` from the body's fields (``parent_run_id`` is
    stored as ``parent_uid``), an event body's items are ``crud.EventIn``s and ``PATCH`` passes
    its fields to ``crud.patch_run``: a field added on one side only would fail every such
    request."""
    import dataclasses
    import inspect

    from noisescope_server import crud
    from noisescope_server.api.schemas import EventItem, RunPatch, RunPut

    wire = (set(RunPut.model_fields) - {"parent_run_id"}) | {"parent_uid"}
    assert wire == {f.name for f in dataclasses.fields(crud.RunIn)}
    assert set(EventItem.model_fields) == {f.name for f in dataclasses.fields(crud.EventIn)}
    keywords = inspect.signature(crud.patch_run).parameters
    patchable = {n for n, p in keywords.items() if p.kind is p.KEYWORD_ONLY} - {"project_scope"}
    assert set(RunPatch.model_fields) == patchable
