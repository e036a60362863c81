"""Stored, then read: whatever a write accepts (and rows stored before a rule, written here
around the API), every read route answers. Random bodies at the edges of every field
(harness/write_then_read.py, hypothesis) go through every write route; then every read
route is asked about what they made. No answer may be a 5xx, nor a read refused for what is
stored; the server log must hold no traceback (the caller counts those)."""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from sqlalchemy import select, update

from harness import columns, run_body
from harness.write_then_read import (
    Exchange,
    Story,
    read_everything,
    server_errors,
    stories,
    write_story,
)
from noisescope_server.models import Event, Run, Sample

__all__ = ["WriteReadResult", "run_write_read"]

API = "/api/v1"


@dataclass
class WriteReadResult:
    examples: int = 0
    writes: Counter[str] = field(default_factory=Counter)
    reads: Counter[str] = field(default_factory=Counter)
    failures: list[Exchange] = field(default_factory=list)
    #: (what was stored around the API, the reads of it, how many failed)
    stored: list[tuple[str, int, int]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.examples > 0 and not self.failures


def _tally(counter: Counter[str], exchanges: list[Exchange]) -> None:
    counter.update(str(e.status) for e in exchanges)


def _around_the_api(c: httpx.Client, engine: Any) -> list[tuple[str, Story]]:
    """Rows the write path refuses now, stored as an older server (or a script) would have:
    each with the story whose reads must still answer."""
    out = []
    project = f"around-{uuid.uuid4().hex[:8]}"
    parent = uuid.uuid4().hex
    c.put(f"{API}/runs/{parent}", json=run_body(project=project, task="t")).raise_for_status()
    c.post(f"{API}/runs/{parent}/samples", json={"columns": columns(80)}).raise_for_status()
    kids = []
    plans = [{"epsilon": -1}, {"epsilon": 0}, {"epsilon": "0.01"},
             {"epsilon": True, "seed": "x"}, {"budget": -5, "lr": 0}]  # fmt: skip
    for size, plan in zip((8, 16, 32, 64, 128), plans, strict=True):
        kid = uuid.uuid4().hex
        body = run_body(project=project, task="t", batch_size=size, parent_run_id=parent,
                        branch_step=40)  # fmt: skip
        c.put(f"{API}/runs/{kid}", json=body).raise_for_status()
        event = {"step": 4, "kind": "branch", "payload": {"loss": 1.0 + size / 1000}}
        c.post(f"{API}/runs/{kid}/events", json={"events": [event]}).raise_for_status()
        with engine.begin() as conn:
            conn.execute(update(Run).where(Run.uid == kid).values(config={"branch": plan}))
        kids.append(kid)
    runs = [{"uid": uid, "body": {"task": "t"}} for uid in (parent, *kids)]
    out.append(("branch runs with ε -1, 0, text, true; budget -5, lr 0", Story(project, runs)))
    wild = uuid.uuid4().hex
    c.put(f"{API}/runs/{wild}", json=run_body(project=project, task="t")).raise_for_status()
    c.post(f"{API}/runs/{wild}/samples", json={"columns": columns(80)}).raise_for_status()
    eval_ = {"step": 5, "kind": "eval", "payload": {"loss": 1.0}}
    c.post(f"{API}/runs/{wild}/events", json={"events": [eval_]}).raise_for_status()
    with engine.begin() as conn:
        run_pk = conn.execute(select(Run.id).where(Run.uid == wild)).scalar_one()
        conn.execute(update(Sample).where(Sample.run_id == run_pk).values(loss=1.7e308))
        conn.execute(update(Event).where(Event.run_id == run_pk).values(
            payload={"loss": 1.7e308, "batch_size": -1}))  # fmt: skip
    out.append(
        (
            "losses of 1.7e308 in samples and an eval",
            Story(project, [runs[0], {"uid": wild, "body": {"task": "t"}}]),
        )
    )
    return out


def run_write_read(base_url: str, engine: Any, examples: int) -> WriteReadResult:
    result = WriteReadResult()
    with httpx.Client(base_url=base_url, timeout=120) as c:

        @settings(max_examples=examples, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(story=stories())
        def story_is_read_back(story: Story) -> None:
            result.examples += 1
            written, read = write_story(c, story), read_everything(c, story)
            _tally(result.writes, written)
            _tally(result.reads, read)
            result.failures += server_errors(written + read)

        story_is_read_back()
        for what, story in _around_the_api(c, engine):
            read = read_everything(c, story)
            _tally(result.reads, read)
            bad = server_errors(read)
            result.failures += bad
            result.stored.append((what, len(read), len(bad)))
    return result
