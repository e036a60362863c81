"""One nesting limit (``_wire.MAX_JSON_DEPTH``) and one size limit (``_wire.MAX_JSON_BYTES``)
for what is written and what is read back: a config or event payload beyond them is refused at
write, and rows already stored beyond them (written around the API) are clipped on read instead
of making every reader's answer a 500 (or every run list carry them)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import Engine, insert, select, update
from starlette.testclient import TestClient

from harness import run_body
from noisescope import _wire
from noisescope_server.jsonclip import CLIPPED, TOO_LARGE, TOO_LARGE_KEY, clip_json
from noisescope_server.models import Event, Run

API = "/api/v1"
LIMIT = _wire.MAX_JSON_DEPTH


def nested(depth: int) -> dict[str, Any]:
    """An object nesting ``depth`` levels (``{}`` is 1)."""
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def test_json_depth_counts_levels() -> None:
    assert _wire.json_depth(1) == 0
    assert _wire.json_depth({}) == 1
    assert _wire.json_depth({"a": [1, {"b": []}]}) == 4
    assert _wire.json_depth(nested(100_000), limit=10) == 11  # stops early, no recursion


def test_clip_json_cuts_at_the_limit_and_keeps_the_rest() -> None:
    value = {"lr": 0.1, "deep": nested(LIMIT + 5), "list": [1, 2]}
    clipped = clip_json(value)
    assert _wire.json_depth(clipped, 10_000) == LIMIT
    assert clipped["lr"] == 0.1 and clipped["list"] == [1, 2]
    inner = clipped["deep"]
    for _ in range(LIMIT - 2):
        inner = inner["a"]
    assert inner == {"a": CLIPPED}
    shallow = {"a": nested(LIMIT - 1)}
    assert clip_json(shallow) is shallow


@pytest.mark.parametrize("depth", [LIMIT + 1, 300, 1000])
def test_a_config_deeper_than_the_limit_is_refused(client: TestClient, depth: int) -> None:
    rid = uuid.uuid4().hex
    config = '{"a":' * (depth - 1) + "{}" + "}" * (depth - 1)  # beyond json.dumps' recursion
    body = f'{{"project": "p", "task": "t", "config": {config}}}'
    r = client.put(f"{API}/runs/{rid}", content=body.encode())
    assert r.status_code == 422, r.text
    assert f"more than {LIMIT} levels" in r.json()["detail"]
    assert "config" in r.json()["detail"]
    assert client.get(f"{API}/runs/{rid}").status_code == 404


def test_an_event_payload_deeper_than_the_limit_is_refused(client: TestClient) -> None:
    rid = uuid.uuid4().hex
    client.put(f"{API}/runs/{rid}", json=run_body()).raise_for_status()
    event = {"step": 1, "kind": "mark", "payload": nested(300)}
    r = client.post(f"{API}/runs/{rid}/events", json={"events": [event]})
    assert r.status_code == 422, r.text
    assert "payload" in r.json()["detail"] and f"{LIMIT} levels" in r.json()["detail"]
    assert client.get(f"{API}/runs/{rid}/events").json() == []


def test_a_config_at_the_limit_reads_back_whole(client: TestClient) -> None:
    rid = uuid.uuid4().hex
    config = {"x": nested(LIMIT - 1)}
    assert client.put(f"{API}/runs/{rid}", json=run_body(config=config)).status_code == 201
    assert client.get(f"{API}/runs/{rid}").json()["config"] == config


def test_rows_stored_too_deep_are_clipped_on_read(client: TestClient, engine: Engine) -> None:
    """Stored through SQLAlchemy, around the API: every reader still gets a 200."""
    rid = uuid.uuid4().hex
    project = f"deep-{rid[:8]}"
    client.put(f"{API}/runs/{rid}", json=run_body(project=project)).raise_for_status()
    with engine.begin() as conn:
        run_pk = conn.execute(select(Run.id).where(Run.uid == rid)).scalar_one()
        conn.execute(
            update(Run)
            .where(Run.id == run_pk)
            .values(config={"lr": 0.1, "deep": nested(300)}, tags=[[[["x"]]]] * 2)
        )
        conn.execute(insert(Event).values(run_id=run_pk, step=3, kind="mark", payload=nested(300)))
    for path in (f"/runs/{rid}", f"/runs?project={project}", "/runs", f"/runs/{rid}/events"):
        r = client.get(API + path)
        assert r.status_code == 200, (path, r.text[:300])
        assert CLIPPED in r.text, path
    run = client.get(f"{API}/runs/{rid}").json()
    assert run["config"]["lr"] == 0.1
    assert _wire.json_depth(run["config"], 10_000) == LIMIT
    (event,) = client.get(f"{API}/runs/{rid}/events").json()
    assert event["step"] == 3 and _wire.json_depth(event["payload"], 10_000) == LIMIT
    assert client.get(f"{API}/tasks").status_code == 200


def test_a_config_or_payload_larger_than_the_size_limit_is_refused(client: TestClient) -> None:
    rid = uuid.uuid4().hex
    big = {"blob": "x" * _wire.MAX_JSON_BYTES}
    r = client.put(f"{API}/runs/{rid}", json=run_body(config=big))
    assert r.status_code == 422, r.text
    assert f"the limit is {_wire.MAX_JSON_BYTES} bytes" in r.json()["detail"]
    client.put(f"{API}/runs/{rid}", json=run_body()).raise_for_status()
    r = client.post(f"{API}/runs/{rid}/events", json={"events": [{"step": 1, "kind": "m",
                                                                  "payload": big}]})  # fmt: skip
    assert r.status_code == 422 and "payload" in r.json()["detail"], r.text
    fits = {"blob": "x" * (_wire.MAX_JSON_BYTES - 20)}
    assert client.put(f"{API}/runs/{rid}", json=run_body(config=fits)).status_code == 200


def test_a_stored_config_larger_than_the_limit_reads_as_a_marker(
    client: TestClient, engine: Engine
) -> None:
    rid = uuid.uuid4().hex
    client.put(f"{API}/runs/{rid}", json=run_body()).raise_for_status()
    with engine.begin() as conn:
        conn.execute(update(Run).where(Run.uid == rid).values(config={"blob": "x" * (1 << 20)}))
    run = client.get(f"{API}/runs/{rid}").json()
    assert run["config"] == {TOO_LARGE_KEY: TOO_LARGE}


def test_rows_stored_with_integers_beyond_64_bits_read_back(
    client: TestClient, engine: Engine
) -> None:
    """The response encoder writes 64-bit integers only: a wider one stored around the API
    reads back as the float the body parser would have made of it, not as a 500."""
    rid = uuid.uuid4().hex
    client.put(f"{API}/runs/{rid}", json=run_body()).raise_for_status()
    wide = 2**70
    with engine.begin() as conn:
        run_pk = conn.execute(select(Run.id).where(Run.uid == rid)).scalar_one()
        conn.execute(
            update(Run).where(Run.id == run_pk).values(config={"seed": wide, "n": [-wide, 3]})
        )
        conn.execute(insert(Event).values(run_id=run_pk, step=1, kind="m", payload={"x": wide}))
    run = client.get(f"{API}/runs/{rid}")
    assert run.status_code == 200, run.text[:300]
    assert run.json()["config"] == {"seed": float(wide), "n": [-float(wide), 3]}
    assert client.get(f"{API}/runs").status_code == 200
    events = client.get(f"{API}/runs/{rid}/events")
    assert events.status_code == 200 and events.json()[0]["payload"] == {"x": float(wide)}


def test_a_run_body_validated_directly_refuses_integers_json_cannot_carry() -> None:
    """Over HTTP the parser turns them into floats; a direct caller gets a validation error."""
    from pydantic import ValidationError

    from noisescope_server.api.schemas import RunPut

    with pytest.raises(ValidationError, match="64-bit"):
        RunPut.model_validate({"project": "p", "task": "t", "config": {"seed": 2**70}})
