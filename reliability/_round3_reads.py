"""Names, sizes, secrets and clocks on the read side (issue 46, items 9 to 11), against a real
server (auth off, as the bad-input server): each case writes what it needs over HTTP, reads it
back through ``noisescope.Api`` (and the dashboard's task keys), and says what it tried, what
came back and whether that holds.

- 9 (a) a project or task named ``.`` or ``..`` is read back (the client sends ``%2E``);
- 9 (b) two tasks whose ``project/task`` read alike get two dashboard keys;
- 9 (c) a run with per-layer series only (``layers`` of them) says so, not "no samples yet";
- 9 (d) a run with ``events`` events: all of them read, against the Run page's bounded reads;
- 10 a password in the server URL is in no ``ApiError``; with the server's log (``log``, a
  server run with ``--access-log``), a ``?token=`` never reaches it;
- 11 a run started a day ahead of the server's clock is stored at the server's time, says so,
  and does not list as the newest.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import httpx

import noisescope
from harness import columns, run_body
from harness.synthetic_sweep import make_sweep, post
from noisescope import protocol
from noisescope_dashboard._frames import MAX_EVALS, MAX_MARKS, NOT_MARKS
from noisescope_dashboard._text import task_key

__all__ = ["ReadCase", "run_round3_reads"]

API = protocol.API_PREFIX
#: What must appear nowhere: the URL's password and the query's token.
PASSWORD = "hunter2-round3-reads"
TOKEN = "t0ken-round3-reads"
#: Events per request (the server's limit per body), layer samples per request.
EVENT_CHUNK = 10_000
SAMPLE_CHUNK = 10_000


@dataclass(frozen=True)
class ReadCase:
    item: str
    name: str
    #: What was written and asked.
    tried: str
    #: What came back, in figures.
    outcome: str
    ok: bool


def _case(item: str, name: str, tried: str, check: Callable[[], tuple[str, bool]]) -> ReadCase:
    """One case; an exception is its outcome (and it does not hold)."""
    try:
        outcome, ok = check()
    except Exception as exc:  # a case that breaks is reported, the others still run
        outcome, ok = f"{type(exc).__name__}: {exc}"[:300], False
    return ReadCase(item, name, tried, outcome, ok)


def _dot_names(c: httpx.Client, api: noisescope.Api) -> tuple[str, bool]:
    tag = uuid.uuid4().hex[:6]
    names = [(".", f"..{tag}"), ("..", "."), (".", "..")]
    wrong = []
    for i, (p, t) in enumerate(names):
        sweep = make_sweep(200.0, (32, 128, 512), rng=random.Random(f"{tag}{i}"))
        post(c, sweep, project=p, task=t)
    for p, t in names:
        report = api.critical_batch(p, t)
        forecast = api.critical_batch_forecast(p, t)
        if (report.project, report.task, forecast.project, forecast.task) != (p, t, p, t):
            wrong.append((p, t))
    return f"{len(names) - len(wrong)} of {len(names)} read back; wrong: {wrong}", not wrong


def _task_keys(c: httpx.Client, api: noisescope.Api) -> tuple[str, bool]:
    tag = uuid.uuid4().hex[:6]
    pairs = [(f"col{tag}", "x/y"), (f"col{tag}/x", "y")]
    for p, t in pairs:
        rid = uuid.uuid4().hex
        c.put(f"{API}/runs/{rid}", json=run_body(project=p, task=t)).raise_for_status()
        c.post(f"{API}/runs/{rid}/samples", json={"columns": columns(64)}).raise_for_status()
    tasks = [x for x in api.tasks() if (x.project, x.task) in pairs]
    keys = {task_key(x.project, x.task) for x in tasks}
    plain = {f"{p}/{t}" for p, t in pairs}
    return (
        f"{len(tasks)} tasks, {len(keys)} keys ({', '.join(sorted(keys))}); written plainly "
        f"they were {len(plain)}",
        len(tasks) == 2 and len(keys) == 2,
    )


def _layers_only(c: httpx.Client, api: noisescope.Api, layers: int) -> tuple[str, bool]:
    rid = uuid.uuid4().hex
    c.put(f"{API}/runs/{rid}", json=run_body(project="round3-layers", task="t")).raise_for_status()
    steps = 4
    names = [f"layer.{i}" for i in range(layers)]
    rows: dict[str, list[Any]] = {}
    for i, name in enumerate(names):
        cols = columns(steps, start=i * steps, series=name)
        cols["step"] = list(range(steps))
        for k, v in cols.items():
            rows.setdefault(k, []).extend(v)
    total = len(rows["seq"])
    for lo in range(0, total, SAMPLE_CHUNK):
        part = {k: v[lo : lo + SAMPLE_CHUNK] for k, v in rows.items()}
        c.post(f"{API}/runs/{rid}/samples", json={"columns": part}).raise_for_status()
    run = api.run(rid)
    listed = len(api.series_names(rid))
    reason = run.b_simple_reason or ""
    said = f"{layers:,} per-layer series ({total:,} samples)" in reason
    return (
        f"series-names lists {listed:,}; n_samples {run.n_samples}; reason: {reason[:110]}...",
        said and listed == layers and "no samples yet" not in reason,
    )


def _timed(read: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    value = read()
    return value, time.perf_counter() - start


def _many_events(c: httpx.Client, api: noisescope.Api, events: int) -> tuple[str, bool]:
    rid = uuid.uuid4().hex
    c.put(f"{API}/runs/{rid}", json=run_body(project="round3-events", task="t")).raise_for_status()
    c.post(f"{API}/runs/{rid}/samples", json={"columns": columns(2000)}).raise_for_status()
    body = [
        {"step": i % 2000, "kind": "eval", "payload": {"loss": 2.0 / (1 + i)}}
        if i % 2
        else {"step": i % 2000, "kind": "checkpoint", "payload": {"path": f"ckpt-{i}"}}
        for i in range(events)
    ]
    for lo in range(0, events, EVENT_CHUNK):
        part = {"events": body[lo : lo + EVENT_CHUNK]}
        c.post(f"{API}/runs/{rid}/events", json=part).raise_for_status()
    every, all_s = _timed(lambda: api.events(rid))

    def page_reads() -> tuple[dict[str, int], int]:
        counts = api.event_counts(rid)
        marks = api.events(rid, exclude_kinds=NOT_MARKS, max_events=MAX_MARKS)
        evals = api.events(rid, kinds=(protocol.EVAL_EVENT_KIND,), max_events=MAX_EVALS)
        return counts, len(marks) + len(evals)

    (counts, drawn), page_s = _timed(page_reads)
    _, summary_s = _timed(lambda: api.run(rid))
    return (
        f"all {len(every):,} events: {all_s:.2f} s; the Run page's reads (counts, "
        f"{MAX_MARKS} marks, {MAX_EVALS:,} evaluations): {drawn:,} events in {page_s:.2f} s; "
        f"the run's summary {summary_s:.2f} s",
        len(every) == events == sum(counts.values()) and drawn <= MAX_MARKS + MAX_EVALS,
    )


def _password(url: str) -> tuple[str, bool]:
    scheme, _, host = url.partition("://")
    shown: list[str] = []
    for target in (f"{scheme}://me:{PASSWORD}@{host}", f"http://me:{PASSWORD}@127.0.0.1:9"):
        try:
            noisescope.Api(target, timeout=5).run("no-such-run")
        except noisescope.ApiError as exc:
            shown += [str(exc), exc.url, exc.detail, str(exc.__cause__ or "")]
    leaked = sum(PASSWORD in text for text in shown)
    return f"{len(shown)} texts of 2 errors, {leaked} with the password", len(
        shown
    ) == 8 and not leaked


def _access_log(c: httpx.Client, log: Callable[[], str]) -> tuple[str, bool]:
    paths = [f"{API}/runs?token={TOKEN}", f"{API}/tasks?access_token={TOKEN}&project=p"]
    for path in paths:
        c.get(path)
    time.sleep(0.5)  # the access log line is written after the answer
    text = log()
    masked = text.count("?token=***") + text.count("?access_token=***")
    return (
        f"{len(paths)} requests with ?token=: the log holds the token {text.count(TOKEN)} times, "
        f"token=*** {masked} times",
        TOKEN not in text and masked >= len(paths),
    )


def _clock(c: httpx.Client, api: noisescope.Api) -> tuple[str, bool]:
    project = f"round3-clock-{uuid.uuid4().hex[:6]}"
    old, skewed, new = (uuid.uuid4().hex for _ in range(3))
    ahead = (datetime.now(timezone.utc) + timedelta(days=1)).isoformat()
    c.put(f"{API}/runs/{old}", json=run_body(project=project)).raise_for_status()
    answer = c.put(f"{API}/runs/{skewed}", json=run_body(project=project, started_at=ahead))
    answer.raise_for_status()
    c.put(f"{API}/runs/{new}", json=run_body(project=project)).raise_for_status()
    ended = c.patch(f"{API}/runs/{skewed}", json={"status": "finished", "ended_at": ahead})
    ended.raise_for_status()
    run = api.run(skewed)
    now = datetime.now(timezone.utc)
    assert run.started_at is not None and run.ended_at is not None
    late = max(run.started_at - now, run.ended_at - now).total_seconds()
    order = [r.uid for r in api.runs(project=project, current=False)]
    warned = len(answer.json().get("warnings", [])) + len(ended.json().get("warnings", []))
    names = {old: "the oldest", skewed: "the skewed one", new: "the newest"}
    return (
        f"sent a day ahead; stored at most {max(late, 0.0):.0f} s ahead of the server's clock; "
        f"{warned} warnings in the answers; listed {names[order[0]]} run first",
        late < 60 and warned == 2 and order == [new, skewed, old],
    )


def run_round3_reads(
    base_url: str,
    *,
    layers: int = 5000,
    events: int = 100_000,
    log: Callable[[], str] | None = None,
) -> list[ReadCase]:
    """Every case against the server at ``base_url`` (auth off). ``log``: the server's log
    text, when it runs with ``--access-log`` (the token case is skipped without it)."""
    api = noisescope.Api(base_url, timeout=300)
    out: list[ReadCase] = []
    with httpx.Client(base_url=base_url, timeout=300) as c:
        out.append(
            _case("9a", "names . and ..", "3 sweeps named ./..x, ../., ./..; critical_batch and "
                  "its forecast of each through noisescope.Api", lambda: _dot_names(c, api))
        )  # fmt: skip
        out.append(
            _case("9b", "task keys", '("colX", "x/y") and ("colX/x", "y"): the dashboard\'s '
                  "task keys", lambda: _task_keys(c, api))
        )  # fmt: skip
        out.append(
            _case("9c", "per-layer series only", f"{layers:,} layers x 4 steps, no whole-model "
                  "series; GET /runs/{id} and series-names", lambda: _layers_only(c, api, layers))
        )  # fmt: skip
        out.append(
            _case("9d", "a run's events", f"{events:,} events (half evaluations); every one, "
                  "then the Run page's bounded reads", lambda: _many_events(c, api, events))
        )  # fmt: skip
        out.append(
            _case("10", "password in the URL", "Api(http://me:PASSWORD@...) on the server and "
                  "on a closed port", lambda: _password(base_url))
        )  # fmt: skip
        if log is not None:
            out.append(
                _case("10", "?token= in the access log", "GET with ?token= and "
                      "?access_token=, then the server's log", lambda: _access_log(c, log))
            )  # fmt: skip
        out.append(
            _case("11", "a clock a day ahead", "PUT started_at and PATCH ended_at a day ahead, "
                  "between two runs started now", lambda: _clock(c, api))
        )  # fmt: skip
    api.close()
    return out
