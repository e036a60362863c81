"""Whatever the write path accepts, every read path can answer: random bodies, valid as the wire
format goes but at the edges of every field (the float range's ends, int64's, the calendar's,
branch plans, parent links), sent through every write route of a real server, then every read
route asked about what they made. No answer may be a 5xx. Used by
tests/server/test_write_then_read.py (CI-sized) and ``python -m reliability`` (its "Stored,
then read" section, larger).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import quote

from hypothesis import strategies as st

from harness.http_clients import HttpClient

__all__ = ["Exchange", "Story", "read_everything", "server_errors", "stories", "write_story"]

API = "/api/v1"
_BIG = 1.7976931348623157e308
#: Floats at the edges a reader meets: the smallest and largest magnitudes, and plain ones.
EDGE_FLOATS = [5e-324, 1e-300, 1e-8, 0.5, 1.0, 3.0, 1e8, 1e154, 1e300, _BIG]
_positive = st.sampled_from(EDGE_FLOATS) | st.floats(min_value=5e-324, max_value=_BIG)
_finite = _positive | _positive.map(lambda v: -v) | st.just(0.0)
_int64 = st.sampled_from([0, 1, 2**31, 2**53 + 1, 2**63 - 1]) | st.integers(0, 2**63 - 1)
_zones = st.sampled_from([-14, -5, 0, 5, 14]).map(lambda h: timezone(timedelta(hours=h)))
_times = st.one_of(
    st.sampled_from(["0001-01-01T00:00:00+14:00", "9999-12-31T23:00:00-14:00",
                     "0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z", "1970-01-01T00:00:00Z"]),
    st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31), timezones=_zones)
    .map(lambda d: d.isoformat()),
    st.sampled_from([0, 1.5, 1e9, 253402300799, 1e12]),
)  # fmt: skip
_text = st.text(max_size=12).filter(lambda s: "\x00" not in s)
#: Mostly a few shared task names, so that runs make sweeps (the critical-batch reads).
_name = st.sampled_from(["t", "t", "t", "task/with/slashes", "ü"]) | _text.filter(
    lambda s: s.strip() != ""
)
_plan = st.fixed_dictionaries(
    {},
    optional={
        "epsilon": _positive, "seed": st.integers(-(2**63), 2**63 - 1),
        "multiplier": st.integers(1, 2**63 - 1), "budget": st.integers(1, 2**63 - 1),
        "step": _int64, "lr": _positive, "lr_rule": _text,
    },
)  # fmt: skip


@dataclass
class Story:
    """What one example writes: runs (each with its samples, events and patches) in one
    project, some branching from others."""

    project: str
    runs: list[dict[str, Any]] = field(default_factory=list)


@st.composite
def _samples(draw: st.DrawFn) -> dict[str, list[Any]]:
    n = draw(st.integers(1, 70))  # past 64, a sample_block is complete
    b_small = draw(st.sampled_from([1.0, 5e-324, 1e-300, 8.0, 1e300]))
    b_big = b_small * draw(st.sampled_from([2.0, 4.0, 1e8])) or 2.0
    norm = draw(st.sampled_from([0.0, 1e-300, 1.0, 40.0, 1e150, 1e300]))
    steps = sorted(draw(st.lists(_int64, min_size=n, max_size=n)))
    cols: dict[str, list[Any]] = {
        "seq": list(range(n)),
        "step": steps,
        "b_small": [b_small] * n,
        "b_big": [b_big] * n,
        "g_small_sq": [norm * (1 + 0.1 * (i % 3)) for i in range(n)],
        "g_big_sq": [norm * (1 + 0.05 * (i % 2)) for i in range(n)],
    }
    for name in ("examples", "loss", "lr", "time"):
        if draw(st.booleans()):
            base = draw(_finite)
            cols[name] = [base if i % 7 else draw(st.none() | _finite) for i in range(n)]
    if draw(st.booleans()):
        cols["series"] = [draw(st.sampled_from(["", "layer.0"])) for _ in range(n)]
    return cols


_payloads = {
    "eval": st.fixed_dictionaries({"loss": _finite}),
    "batch_size": st.fixed_dictionaries({"batch_size": _finite}),
    "branch": st.fixed_dictionaries({"loss": st.none() | _finite, "diverged": st.booleans()}),
    "notice": st.fixed_dictionaries({"message": _text}),
    "mark": st.dictionaries(_text, _finite | _text, max_size=3),
}
_events = st.sampled_from(sorted(_payloads)).flatmap(
    lambda kind: st.fixed_dictionaries(
        {"step": _int64, "kind": st.just(kind), "payload": _payloads[kind]},
        optional={"time": _finite},
    )
)


@st.composite
def stories(draw: st.DrawFn) -> Story:
    story = Story(project=f"wtr-{uuid.uuid4().hex[:10]}")
    for i in range(draw(st.integers(1, 4))):
        body: dict[str, Any] = {"project": story.project, "task": draw(_name)}
        if draw(st.booleans()):
            body["batch_size"] = draw(_positive)
        if draw(st.booleans()):
            body["units"] = draw(st.sampled_from(["examples", "tokens"]))
        if draw(st.booleans()):
            body["started_at"] = draw(_times)
        if draw(st.booleans()):
            body["status"] = draw(st.sampled_from(["running", "finished", "failed", "crashed"]))
        config: dict[str, Any] = {}
        if draw(st.booleans()):
            config["branch"] = draw(_plan)
        body["config"] = config
        if i and draw(st.booleans()):  # a branch of an earlier run (or of an unknown one)
            parent = draw(st.integers(-1, i - 1))
            body["parent_run_id"] = parent
            body["branch_step"] = draw(_int64)
        patch: dict[str, Any] = {}
        for key, value in (("status", st.sampled_from(["finished", "failed", "running"])),
                           ("ended_at", _times), ("batch_size", _positive)):  # fmt: skip
            if draw(st.booleans()):
                patch[key] = draw(value)
        story.runs.append(
            {
                "uid": f"r{i}-{uuid.uuid4().hex[:12]}",
                "body": body,
                "samples": draw(st.none() | _samples()),
                "events": draw(st.lists(_events, max_size=4)),
                "patch": patch or None,
            }
        )
    return story


@dataclass
class Exchange:
    request: str
    status: int
    detail: str


def _send(c: HttpClient, out: list[Exchange], method: str, path: str, **kw: Any) -> int:
    r = c.request(method, API + path, **kw)
    out.append(Exchange(f"{method} {path} {kw.get('params') or ''}", r.status_code, r.text[:300]))
    return r.status_code


def write_story(c: HttpClient, story: Story) -> list[Exchange]:
    """Every write of ``story``, in order (a refusal is fine; a 5xx is not)."""
    out: list[Exchange] = []
    for run in story.runs:
        body = dict(run["body"])
        if "parent_run_id" in body:
            k = body["parent_run_id"]
            body["parent_run_id"] = story.runs[k]["uid"] if k >= 0 else uuid.uuid4().hex
        _send(c, out, "PUT", f"/runs/{run['uid']}", json=body)
        if run["samples"] is not None:
            _send(c, out, "POST", f"/runs/{run['uid']}/samples", json={"columns": run["samples"]})
        if run["events"]:
            _send(c, out, "POST", f"/runs/{run['uid']}/events", json={"events": run["events"]})
        if run["patch"] is not None:
            _send(c, out, "PATCH", f"/runs/{run['uid']}", json=run["patch"])
        _send(c, out, "POST", f"/runs/{run['uid']}/heartbeat")
    return out


def _reads(story: Story) -> list[tuple[str, dict[str, Any]]]:
    paths: list[tuple[str, dict[str, Any]]] = [
        ("/projects", {}),
        ("/runs", {"project": story.project}),
        ("/runs", {"project": story.project, "current": "false"}),
        ("/tasks", {"project": story.project}),
    ]
    uids = [r["uid"] for r in story.runs]
    paths.append(("/series", {"runs": uids}))
    for uid in uids:
        paths += [(f"/runs/{uid}{tail}", {}) for tail in
                  ("", "/series-names", "/events", "/samples.csv", "/branches",
                   "/recommendation")]  # fmt: skip
        paths += [(f"/runs/{uid}/series", {"x": x}) for x in ("step", "examples", "time")]
        paths.append((f"/runs/{uid}/series", {"window": 1e15, "max_points": 1}))
    for task in sorted({r["body"]["task"].strip() for r in story.runs}):
        at = f"/tasks/{quote(story.project, safe='')}/{quote(task, safe='')}/critical-batch"
        paths += [(at, {"loss": loss}) for loss in ("auto", "eval", "train")]
        paths.append((at, {"include_diverged": "true"}))
        paths.append((f"{at}/forecast", {"loss": [1e-300, 1.0, 1e300]}))
    return paths


def read_everything(c: HttpClient, story: Story) -> list[Exchange]:
    """Every read route about what ``story`` wrote."""
    out: list[Exchange] = []
    for path, params in _reads(story):
        _send(c, out, "GET", path, params=params)
    return out


#: The 422 for a request value the database cannot use: on a read of stored rows, the stored
#: rows are at fault, not the request (steps near 2^63 once overflowed a bucket product).
DATABASE_BLAME = "cannot be used by the database"


def server_errors(exchanges: list[Exchange]) -> list[Exchange]:
    """The answers no request may get: a 5xx, or a read refused for what was stored."""
    return [
        e
        for e in exchanges
        if e.status >= 500 or (e.request.startswith("GET") and DATABASE_BLAME in e.detail)
    ]
