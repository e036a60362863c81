"""Every endpoint, through the real server, on SQLite and PostgreSQL."""

from __future__ import annotations

import csv
import gzip
import io
import math
import uuid
from typing import Any

import orjson
import pytest
from starlette.testclient import TestClient

from harness.http_clients import HttpResponse
from harness.payloads import columns, expected_sums, run_body
from noisescope.estimators import NoiseScale, current_window, two_batch_estimates

API = "/api/v1"


def _norms(cols: dict[str, Any]) -> list[tuple[float, float, float, float]]:
    names = ("b_small", "b_big", "g_small_sq", "g_big_sq")
    return list(zip(*(cols[n] for n in names), strict=True))


def put_run(client: TestClient, run_id: str, **body: Any) -> HttpResponse:
    return client.put(f"{API}/runs/{run_id}", json=run_body(**body))


def post_samples(client: TestClient, run_id: str, cols: dict[str, Any]) -> HttpResponse:
    return client.post(f"{API}/runs/{run_id}/samples", json={"columns": cols})


def test_health(client: TestClient) -> None:
    r = client.get(f"{API}/health")
    assert r.status_code == 200
    assert r.json() == {"status": "ok"}


def test_openapi_is_published_with_every_endpoint(client: TestClient) -> None:
    spec = client.get(f"{API}/openapi.json").json()
    paths = spec["paths"]
    for path in (
        "/api/v1/runs/{run_id}",
        "/api/v1/runs/{run_id}/samples",
        "/api/v1/runs/{run_id}/events",
        "/api/v1/runs",
        "/api/v1/runs/{run_id}/series",
        "/api/v1/runs/{run_id}/samples.csv",
        "/api/v1/tasks",
        "/api/v1/series",
        "/api/v1/tasks/{project}/{task}/critical-batch",
        "/api/v1/parallelism",
    ):
        assert path in paths, path
    samples_schema = paths["/api/v1/runs/{run_id}/samples"]["post"]["requestBody"]["content"][
        "application/json"
    ]["schema"]
    assert "g_small_sq" in samples_schema["properties"]["columns"]["properties"]


def test_put_run_is_idempotent(client: TestClient, run_id: str) -> None:
    first = put_run(client, run_id, tags=["a"])
    assert first.status_code == 201, first.text
    assert first.json()["created"] is True
    again = put_run(client, run_id, tags=["a", "b"], name="renamed")
    assert again.status_code == 200
    assert again.json()["created"] is False
    run = client.get(f"{API}/runs/{run_id}").json()
    assert run["name"] == "renamed"
    assert run["tags"] == ["a", "b"]
    assert run["batch_size"] == 32
    assert run["status"] == "running"
    assert len(client.get(f"{API}/runs", params={"search": run_id}).json()) == 1


def test_run_cannot_move_to_another_project(client: TestClient, run_id: str) -> None:
    assert put_run(client, run_id, project="p-one").status_code == 201
    r = put_run(client, run_id, project="p-two")
    assert r.status_code == 409
    assert "already taken by another project" in r.json()["detail"]
    assert "p-one" not in r.json()["detail"]  # another project's name is not disclosed


def test_samples_insert_and_resend_never_duplicates(client: TestClient, run_id: str) -> None:
    put_run(client, run_id)
    cols = columns(300)
    r = post_samples(client, run_id, cols)
    assert r.status_code == 200, r.text
    assert r.json() == {"received": 300, "inserted": 300}
    assert post_samples(client, run_id, cols).json() == {"received": 300, "inserted": 0}
    # a batch overlapping the previous one by 100 samples
    overlap = columns(200, start=200)
    assert post_samples(client, run_id, overlap).json() == {"received": 200, "inserted": 100}
    run = client.get(f"{API}/runs/{run_id}").json()
    assert run["n_samples"] == 400
    assert run["last_step"] == 399


def test_gzip_body(client: TestClient, run_id: str) -> None:
    put_run(client, run_id)
    body = gzip.compress(orjson.dumps({"columns": columns(50)}))
    r = client.post(
        f"{API}/runs/{run_id}/samples",
        content=body,
        headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
    )
    assert r.status_code == 200, r.text
    assert r.json()["inserted"] == 50


def test_series_sums_are_exact_and_ratio_comes_last(client: TestClient, run_id: str) -> None:
    put_run(client, run_id)
    cols = columns(1000, seed=3)
    post_samples(client, run_id, cols)
    run_before = client.get(f"{API}/runs/{run_id}").json()
    r = client.get(f"{API}/runs/{run_id}/series", params={"max_points": 10})
    assert r.status_code == 200, r.text
    series = r.json()
    points = series["points"]
    assert 1 <= len(points) <= 10
    assert sum(p["n"] for p in points) == 1000
    g_total, s_total = expected_sums(cols)
    assert math.isclose(sum(p["sum_g_sq"] for p in points), g_total, rel_tol=1e-9)
    assert math.isclose(sum(p["sum_trace_sigma"] for p in points), s_total, rel_tol=1e-9)
    for p in points:  # each bucket's B_simple is the ratio of its sums
        expected = NoiseScale.from_sums(p["sum_g_sq"], p["sum_trace_sigma"], p["n"]).b_simple
        assert p["b_simple"] == pytest.approx(expected)
        if p["b_simple_lo"] is not None:
            assert p["b_simple_lo"] <= p["b_simple"] <= p["b_simple_hi"]
    assert points[0]["x_lo"] == 0
    assert points[-1]["x_hi"] == 999
    # x = examples: the same samples, on the examples axis
    ex = client.get(f"{API}/runs/{run_id}/series", params={"x": "examples", "max_points": 7}).json()
    assert len(ex["points"]) <= 7
    assert sum(p["n"] for p in ex["points"]) == 1000
    assert ex["points"][-1]["x_hi"] == 999 * 32
    # a trailing window of 300 steps: the last point sums the buckets ending after step 699
    smoothed = client.get(
        f"{API}/runs/{run_id}/series", params={"max_points": 10, "window": 300}
    ).json()
    assert smoothed["window_steps"] == 300
    inside = [p for p in points if p["step_hi"] > points[-1]["step_hi"] - 300]
    assert 3 <= len(inside) <= 4
    assert smoothed["points"][-1]["n"] == sum(p["n"] for p in inside)
    assert smoothed["points"][-1]["sum_g_sq"] == pytest.approx(sum(p["sum_g_sq"] for p in inside))
    # smoothing changes the curve, never the run's current B_simple
    assert client.get(f"{API}/runs/{run_id}").json()["b_simple"] == run_before["b_simple"]
    assert client.get(f"{API}/runs/{run_id}/series", params={"x": "bogus"}).status_code == 422


def test_list_runs_filters_and_current_b_simple(client: TestClient) -> None:
    project = f"filters-{uuid.uuid4().hex[:8]}"
    ids = [uuid.uuid4().hex for _ in range(3)]
    put_run(client, ids[0], project=project, task="mnist", tags=["sweep"])
    put_run(client, ids[1], project=project, task="mnist")
    put_run(client, ids[2], project=project, task="cifar", tags=["sweep"])
    post_samples(client, ids[0], columns(600, seed=1))
    client.patch(f"{API}/runs/{ids[1]}", json={"status": "finished"})

    def uids(**params: Any) -> set[str]:
        r = client.get(f"{API}/runs", params={"project": project, **params})
        assert r.status_code == 200, r.text
        return {run["uid"] for run in r.json()}

    assert uids() == set(ids)
    assert uids(task="mnist") == {ids[0], ids[1]}
    assert uids(tag="sweep") == {ids[0], ids[2]}
    assert uids(status="finished") == {ids[1]}
    assert uids(search="cifar") == {ids[2]}
    assert uids(started_after="2999-01-01T00:00:00Z") == set()
    run = client.get(f"{API}/runs/{ids[0]}").json()
    assert run["n_samples"] == 600
    assert run["last_loss"] == pytest.approx(2.0 / (1.0 + 0.01 * 599))
    # the current window is estimators.current_window's on the same per-sample estimates, and
    # its B_simple the ratio of the sums over exactly those last samples
    cols = columns(600, seed=1)
    g_sq, trace_sigma = zip(*(two_batch_estimates(*row) for row in _norms(cols)), strict=True)
    k, window = current_window([1.0] * 600, list(g_sq), list(trace_sigma))
    interval = window.interval
    assert interval.b_simple is not None
    assert run["window_samples"] == k >= 64
    assert (run["window_first_step"], run["window_last_step"]) == (600 - k, 599)
    tail = {name: values[600 - k :] for name, values in cols.items()}
    g_total, s_total = expected_sums(tail)
    assert run["b_simple"] == pytest.approx(s_total / g_total)
    assert (run["b_simple_lo"], run["b_simple_hi"]) == pytest.approx(
        (interval.b_simple.lo, interval.b_simple.hi)
    )
    assert run["b_simple_lo"] <= run["b_simple"] <= run["b_simple_hi"]
    assert run["batch_in_use"] == 32
    assert run["batch_to_b_simple"] == pytest.approx(32 / run["b_simple"])
    # fewer samples than the minimum: no number, no ratio, and the reason
    short = client.get(f"{API}/runs/{ids[1]}").json()
    assert short["b_simple"] is None and short["batch_to_b_simple"] is None
    assert short["b_simple_reason"].startswith("no samples yet")
    assert project in client.get(f"{API}/projects").json()


def test_patch_run_status(client: TestClient, run_id: str) -> None:
    put_run(client, run_id)
    r = client.patch(f"{API}/runs/{run_id}", json={"status": "finished"})
    assert r.status_code == 200, r.text
    run = client.get(f"{API}/runs/{run_id}").json()
    assert run["status"] == "finished"
    assert run["ended_at"] is not None
    assert client.patch(f"{API}/runs/{run_id}", json={"status": "exploded"}).status_code == 422


def test_events_idempotent_with_seq(client: TestClient, run_id: str) -> None:
    put_run(client, run_id)
    events = [
        {"step": 10, "kind": "batch_size", "payload": {"from": 32, "to": 64}, "seq": 0},
        {"step": 20, "kind": "mark", "seq": 1},
    ]
    r = client.post(f"{API}/runs/{run_id}/events", json={"events": events})
    assert r.json() == {"received": 2, "inserted": 2}
    r = client.post(f"{API}/runs/{run_id}/events", json={"events": events})
    assert r.json() == {"received": 2, "inserted": 0}
    got = client.get(f"{API}/runs/{run_id}/events").json()
    assert [(e["step"], e["kind"], e["payload"]) for e in got] == [
        (10, "batch_size", {"from": 32, "to": 64}),
        (20, "mark", {}),
    ]


def test_series_names(client: TestClient, run_id: str) -> None:
    put_run(client, run_id)
    post_samples(client, run_id, columns(10))
    post_samples(client, run_id, columns(5, start=10, series="layer.0"))
    names = client.get(f"{API}/runs/{run_id}/series-names").json()
    assert names == [{"name": "", "n_samples": 10}, {"name": "layer.0", "n_samples": 5}]
    layer = client.get(f"{API}/runs/{run_id}/series", params={"series": "layer.0"}).json()
    assert sum(p["n"] for p in layer["points"]) == 5


def test_csv_export_returns_the_raw_samples(client: TestClient, run_id: str) -> None:
    put_run(client, run_id)
    cols = columns(123)
    post_samples(client, run_id, cols)
    r = client.get(f"{API}/runs/{run_id}/samples.csv")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert len(rows) == 123
    assert [int(row["seq"]) for row in rows] == cols["seq"]
    assert float(rows[7]["g_small_sq"]) == cols["g_small_sq"][7]
    assert client.get(f"{API}/runs/nope/samples.csv").status_code == 404


def test_tasks_summarise_their_runs(client: TestClient) -> None:
    project = f"tasks-{uuid.uuid4().hex[:8]}"
    ids = []
    for batch, loss0 in ((32, 2.0), (128, 4.0)):
        rid = uuid.uuid4().hex
        ids.append(rid)
        put_run(client, rid, project=project, task="lsq", batch_size=batch)
        post_samples(client, rid, columns(400, loss0=loss0))
    tasks = client.get(f"{API}/tasks", params={"project": project}).json()
    assert len(tasks) == 1
    assert tasks[0]["n_runs"] == 2
    assert tasks[0]["batch_sizes"] == [32, 128]
    current = [client.get(f"{API}/runs/{rid}").json()["b_simple"] for rid in ids]
    assert tasks[0]["n_measured"] == 2
    assert tasks[0]["b_simple_min"] == pytest.approx(min(current))
    assert tasks[0]["b_simple_max"] == pytest.approx(max(current))


def test_unknown_run_is_404(client: TestClient) -> None:
    missing = uuid.uuid4().hex
    r = post_samples(client, missing, columns(3))
    assert r.status_code == 404
    assert "PUT" in r.json()["detail"]
    assert client.get(f"{API}/runs/{missing}").status_code == 404
    assert client.get(f"{API}/runs/{missing}/series").status_code == 404
    assert client.patch(f"{API}/runs/{missing}", json={"status": "failed"}).status_code == 404
    r = client.post(f"{API}/runs/{missing}/events", json={"events": []})
    assert r.status_code == 404
