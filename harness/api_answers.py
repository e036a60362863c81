"""One hash of everything the read API answers about one database, for refactors that must
not change an answer ("the same answers before and after").

``answers_hash()`` builds the app in this process (``AppServer``, SQLite), writes one database
through the real write routes (``PUT``/``PATCH /runs``, ``POST`` samples, events and
heartbeats: a synthetic sweep whose critical batch is known, a run with branch runs, a run
with per-layer series and notices) and the read client's writes (rename, tags, archive), then
asks every ``GET`` route of the API and every read of ``noisescope.Api`` about it, and hashes
the canonical JSON of the answers. Everything written is fixed (ids, steps, values, times), so
the hash depends only on the code. What does depend on the clock is masked: a timestamp within
a day of now (the server's own ``last_seen_at``, a heartbeat) reads ``"<now>"``.

Used by ``tests/test_api_answers.py`` (the hash of this code is stable, and equal on SQLite
under two fresh servers) and by hand: ``python -m harness.api_answers`` prints the hash, to be
compared with the same command on another checkout (issue 59 recorded main's).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import random
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from functools import partial
from typing import Any
from urllib.parse import quote

from harness import synthetic_sweep
from harness.inprocess import AppServer
from harness.payloads import columns, run_body
from noisescope import Api, ApiError

__all__ = ["answers", "answers_hash", "populate", "read_paths"]

API = "/api/v1"
PROJECT = "answers"
SWEEP_TASK = "sweep/task"
#: A day: timestamps closer than this to now were stamped by the server's clock.
_NOW_WINDOW = timedelta(days=1)


def _uid(i: int) -> str:
    return f"{i:032x}"


def _ok(answer: Any) -> None:
    assert answer.status_code in (200, 201, 204), (answer.status_code, answer.text[:300])


def populate(server: AppServer) -> dict[str, list[str]]:
    """Write the fixed database; returns the run ids and tasks it made, by kind."""
    runs: dict[str, list[str]] = {"sweep": [], "other": [], "tasks": [SWEEP_TASK, "lm", "ü"]}
    sweep = synthetic_sweep.make_sweep(
        64.0, [16, 64, 256], lrs=((0.1, 0.6), (0.3, 1.0)), rng=random.Random(3)
    )
    sweep = [dataclasses.replace(r, uid=_uid(100 + i)) for i, r in enumerate(sweep)]
    with server.client() as http:
        synthetic_sweep.post(
            http, sweep, project=PROJECT, task=SWEEP_TASK, train_noise=0.02,
            rng=random.Random(4),
        )  # fmt: skip
        runs["sweep"] = [r.uid for r in sweep]
        parent = _uid(1)
        _ok(http.put(f"{API}/runs/{parent}", json=run_body(
            PROJECT, "lm", name="parent", tags=["base", "x"], units="tokens",
            started_at="2026-01-02T03:04:05Z", config={"lr": 0.1, "branch": {"epsilon": 0.1}},
        )))  # fmt: skip
        cols = columns(300, seed=1)
        cols["series"] = ["" if i % 3 else "layer.0" for i in range(300)]
        _ok(http.post(f"{API}/runs/{parent}/samples", json={"columns": cols}))
        events = [
            {"seq": 0, "step": 0, "kind": "batch_size", "payload": {"batch_size": 32}},
            {"seq": 1, "step": 50, "kind": "eval", "payload": {"loss": 1.5}},
            {"seq": 2, "step": 120, "kind": "batch_size", "payload": {"batch_size": 64}},
            {"seq": 3, "step": 150, "kind": "eval", "payload": {"loss": 1.2}},
            {"seq": 4, "step": 151, "kind": "notice", "payload": {"message": "hello"}},
            {"seq": 5, "step": 152, "kind": "mark", "payload": {"what": "lr drop", "x": 2.0}},
        ]
        _ok(http.post(f"{API}/runs/{parent}/events", json={"events": events}))
        runs["other"].append(parent)
        for k, (step, batch) in enumerate([(100, 16), (100, 64), (100, 256), (200, 32)]):
            child = _uid(10 + k)
            _ok(http.put(f"{API}/runs/{child}", json=run_body(
                PROJECT, "lm", name=f"branch-{k}", batch_size=batch, units="tokens",
                parent_run_id=parent, branch_step=step, status="finished",
                started_at="2026-01-02T04:00:00Z", config={"branch": {"epsilon": 0.1}},
            )))  # fmt: skip
            payload = {"loss": 1.4 - 0.1 * math.log2(batch / 16) / (1 + batch / 64)}
            branch_event = {"seq": 0, "step": step + 10, "kind": "branch", "payload": payload}
            _ok(http.post(f"{API}/runs/{child}/events", json={"events": [branch_event]}))
            _ok(http.post(f"{API}/runs/{child}/samples", json={"columns": columns(
                20, start=step, seed=10 + k, b_big=float(batch), b_small=batch / 4,
            )}))  # fmt: skip
            runs["other"].append(child)
        lonely = _uid(2)  # no samples, a crash, a task name with a non-ASCII letter
        _ok(http.put(f"{API}/runs/{lonely}", json=run_body(
            PROJECT, "ü", name="lonely", started_at="2026-01-03T00:00:00+05:00",
        )))  # fmt: skip
        _ok(http.patch(f"{API}/runs/{lonely}", json={
            "status": "failed", "ended_at": "2026-01-03T01:00:00Z",
        }))  # fmt: skip
        _ok(http.post(f"{API}/runs/{lonely}/heartbeat"))
        runs["other"].append(lonely)
        archived = _uid(3)
        _ok(http.put(f"{API}/runs/{archived}", json=run_body(
            PROJECT, "lm", name="old", started_at="2025-12-31T23:00:00Z", status="finished",
        )))  # fmt: skip
        _ok(http.post(f"{API}/runs/{archived}/samples", json={"columns": columns(80, seed=5)}))
        runs["other"].append(archived)
    with server.api() as api:
        api.rename_run(lonely, "lonely, renamed")
        api.set_tags(parent, ["base", "tagged"])
        api.archive_run(archived)
    return runs


def _reads(runs: dict[str, list[str]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every GET route of the API, with the queries that change what it reads."""
    yield "/health", {}
    yield "/projects", {}
    yield "/auth/whoami", {}
    yield f"/projects/{PROJECT}/tokens", {}
    for archived in ("exclude", "include", "only"):
        yield "/runs", {"archived": archived}
    yield "/runs", {"project": PROJECT, "current": "false"}
    yield "/runs", {"task": "lm", "tag": "base"}
    yield "/runs", {"status": "finished", "limit": 3}
    yield "/runs", {"search": "branch", "started_after": "2026-01-02T03:30:00Z"}
    yield "/tasks", {}
    yield "/tasks", {"project": PROJECT}
    all_runs = runs["sweep"] + runs["other"]
    yield "/series", {"runs": all_runs, "archived": "include"}
    yield "/series", {"runs": all_runs[:3], "max_points": 7, "window_fraction": 0.3}
    for uid in all_runs:
        for tail in ("", "/series-names", "/events", "/event-counts", "/samples.csv",
                     "/branches", "/recommendation"):  # fmt: skip
            yield f"/runs/{uid}{tail}", {}
        for x in ("step", "examples", "time"):
            yield f"/runs/{uid}/series", {"x": x}
        yield f"/runs/{uid}/series", {"window": 50, "max_points": 9}
        yield f"/runs/{uid}/series", {"series": "layer.0"}
        yield f"/runs/{uid}/events", {"kind": ["eval", "branch"], "max_events": 2}
        yield f"/runs/{uid}/events", {"exclude_kind": "eval"}
        yield f"/runs/{uid}/samples.csv", {"series": "layer.0"}
        yield f"/runs/{uid}/recommendation", {
            "batch_size": 48, "candidates": [16, 128], "throughput": ["16:100", "128:700"],
            "reference_batch": 4,
        }  # fmt: skip
    for task in runs["tasks"]:
        at = f"/tasks/{quote(PROJECT, safe='')}/{quote(task, safe='')}/critical-batch"
        for loss in ("auto", "eval", "train"):
            yield at, {"loss": loss}
        yield at, {"targets": [1.0, 0.8], "include_diverged": "true"}
        yield f"{at}/forecast", {}
        yield f"{at}/forecast", {"loss": [0.6, 0.9], "targets": [1.0, 0.8]}
    yield "/parallelism", {"b_crit": 300, "per_device_batch": 8}
    # refusals answer too: an unknown run, a target that is no number, a bad pair, too few
    yield f"/runs/{_uid(999)}", {}
    yield f"/runs/{_uid(999)}/series", {}
    yield f"/tasks/{PROJECT}/lm/critical-batch", {"targets": "nan"}
    yield f"/runs/{runs['other'][0]}/recommendation", {"throughput": "64"}
    yield "/parallelism", {"b_crit": 300, "per_device_batch": 8, "max_devices": 1}
    yield "/parallelism", {
        "b_crit": 300, "per_device_batch": 8, "s_min": 1000, "step_time": 0.5,
        "max_devices": 64, "units": "tokens", "batch_size": 512, "reference": "B_simple",
    }  # fmt: skip


def read_paths() -> list[str]:
    """The paths ``answers()`` asks (for a test that every GET route is among them)."""
    runs = {"sweep": [_uid(100)], "other": [_uid(1)], "tasks": [SWEEP_TASK]}
    return [path for path, _ in _reads(runs)]


def _api_reads(api: Api, runs: dict[str, list[str]]) -> Iterator[tuple[str, Callable[[], Any]]]:
    """Every read of ``noisescope.Api``, as (a name, the call)."""
    yield "projects", api.projects
    yield "runs", lambda: api.runs(archived="include")
    yield "runs lm", lambda: api.runs(project=PROJECT, task="lm", current=False)
    yield "access", api.access
    yield "tasks", api.tasks
    all_runs = runs["sweep"] + runs["other"]
    yield "compare", lambda: api.compare(all_runs)
    for uid in all_runs:
        yield f"run {uid}", partial(api.run, uid)
        yield f"series {uid}", partial(api.series, uid, x="examples", window=20)
        yield f"series-names {uid}", partial(api.series_names, uid)
        yield f"events {uid}", partial(api.events, uid, exclude_kinds=["mark"])
        yield f"event-counts {uid}", partial(api.event_counts, uid)
        yield f"csv {uid}", partial(api.samples_csv, uid)
        yield f"recommendation {uid}", partial(api.recommendation, uid, batch_size=32)
        yield f"branches {uid}", partial(api.branches, uid)
    for task in runs["tasks"]:
        yield f"critical {task}", partial(api.critical_batch, PROJECT, task)
        yield (
            f"forecast {task}",
            partial(api.critical_batch_forecast, PROJECT, task, losses=[0.6, 0.9]),
        )
    yield "parallelism", lambda: api.parallelism(300.0, 8.0, s_min=1000.0, step_time=0.5)


def _canonical(value: Any, now: datetime) -> Any:
    """JSON-ready ``value``: dataclasses as dicts, floats by ``repr`` (every bit, and NaN and
    infinities too), timestamps near ``now`` masked."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _canonical(getattr(value, f.name), now) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _canonical(v, now) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canonical(v, now) for v in value]
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, datetime):
        value = value.isoformat()
    if isinstance(value, str) and len(value) >= 19 and value[4:5] == "-" and value[10:11] == "T":
        try:
            stamp = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return value
        if stamp.tzinfo is not None and abs(stamp - now) < _NOW_WINDOW:
            return "<now>"
    return value


def answers() -> dict[str, Any]:
    """Every answer of a fresh server on the fixed database, canonical, by request."""
    now = datetime.now(timezone.utc)
    out: dict[str, Any] = {}
    with AppServer() as server:
        runs = populate(server)
        with server.client() as http:
            for path, params in _reads(runs):
                answer = http.get(API + path, params=params)
                key = f"GET {path} {json.dumps(params, sort_keys=True)}"
                kind = answer.headers.get("content-type", "")
                body = answer.json() if kind.startswith("application/json") else answer.text
                out[key] = [answer.status_code, _canonical(body, now)]
        with server.api() as api:
            for name, call in _api_reads(api, runs):
                try:
                    result: Any = call()
                except ApiError as e:
                    result = f"{type(e).__name__}: {e}"
                out[f"Api {name}"] = _canonical(result, now)
    return out


def answers_hash() -> str:
    """SHA-256 of the canonical JSON of ``answers()``."""
    text = json.dumps(answers(), sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


if __name__ == "__main__":
    print(answers_hash())
