"""Rows the API would refuse, written straight into the database, and runs that die: reads must
still answer 200 for everyone (a stored config nested 300 deep once made ``GET /runs`` a 500),
and a running run that went silent must read "crashed", then "running" after a heartbeat."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import httpx
from sqlalchemy import insert, select, update

from noisescope import _wire
from noisescope_server.jsonclip import CLIPPED, TOO_LARGE, TOO_LARGE_KEY
from noisescope_server.models import Event, Run
from reliability._check import Check
from reliability._hostile import API

__all__ = ["run_crashed", "run_stored"]


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def run_stored(base_url: str, engine: Any, depth: int = 300) -> list[Check]:
    """A run whose config, tags and an event payload nest ``depth`` deep, stored through
    SQLAlchemy: every read that returns them answers 200 with the deep part clipped."""
    rid = uuid.uuid4().hex
    project = f"stored-{rid[:8]}"
    out: list[Check] = []
    with httpx.Client(base_url=base_url + API, timeout=60) as client:
        client.put(f"/runs/{rid}", json={"project": project, "task": "t"}).raise_for_status()
        with engine.begin() as conn:
            run_pk = conn.execute(select(Run.id).where(Run.uid == rid)).scalar_one()
            conn.execute(
                update(Run)
                .where(Run.id == run_pk)
                .values(config={"lr": 0.1, "deep": _nested(depth)}, tags=[[[["x"]]]])
            )
            conn.execute(
                insert(Event).values(run_id=run_pk, step=1, kind="m", payload=_nested(depth))
            )
        for path in (f"/runs/{rid}", f"/runs?project={project}", "/runs", f"/runs/{rid}/events",
                     "/tasks", f"/tasks/{project}/t/critical-batch"):  # fmt: skip
            r = client.get(path)
            clipped = "clipped" if CLIPPED in r.text else "whole"
            want = "whole" if "tasks" in path else "clipped"
            out.append(Check(f"GET {path.replace(rid, '{id}')} (config {depth} deep)",
                             f"200 {want}", f"{r.status_code} {clipped}"))  # fmt: skip
        with engine.begin() as conn:
            conn.execute(update(Run).where(Run.id == run_pk).values(config={"x": "y" * (1 << 20)}))
        got = client.get(f"/runs/{rid}")
        shown = "marker" if got.json().get("config") == {TOO_LARGE_KEY: TOO_LARGE} else "whole"
        out.append(Check("GET /runs/{id} (config 1 MiB)", "200 marker",
                         f"{got.status_code} {shown}"))  # fmt: skip
        wide = 2**70  # the response encoder writes 64-bit integers only
        with engine.begin() as conn:
            conn.execute(update(Run).where(Run.id == run_pk).values(config={"seed": wide}))
        for path in (f"/runs/{rid}", "/runs"):
            r = client.get(path)
            out.append(Check(f"GET {path.replace(rid, '{id}')} (an integer beyond 64 bits)",
                             "200", str(r.status_code)))  # fmt: skip
    return out


def run_crashed(base_url: str, engine: Any) -> list[Check]:
    """Heartbeats and the read-time crashed status (``crash_after`` at its default)."""
    rid = uuid.uuid4().hex
    out: list[Check] = []

    def status() -> str:
        return str(client.get(f"/runs/{rid}").json().get("status"))

    with httpx.Client(base_url=base_url + API, timeout=60) as client:
        client.put(f"/runs/{rid}", json={"project": "crashed", "task": "t"}).raise_for_status()
        hb = client.post(f"/runs/{rid}/heartbeat")
        out.append(Check("heartbeat of a live run", "204 running", f"{hb.status_code} {status()}"))
        then = datetime.now(timezone.utc) - timedelta(seconds=_wire.CRASH_AFTER + 60)
        with engine.begin() as conn:
            conn.execute(update(Run).where(Run.uid == rid).values(last_seen_at=then))
        listed = client.get("/runs", params={"project": "crashed", "status": "crashed"}).json()
        found = "listed" if any(r["uid"] == rid for r in listed) else "not listed"
        out.append(Check(f"silent for crash_after + 60 s ({_wire.CRASH_AFTER + 60:g} s)",
                         "crashed, listed", f"{status()}, {found}"))  # fmt: skip
        hb = client.post(f"/runs/{rid}/heartbeat")
        out.append(
            Check("heartbeat after the silence", "204 running", f"{hb.status_code} {status()}")
        )
        client.patch(f"/runs/{rid}", json={"status": "finished"}).raise_for_status()
        with engine.begin() as conn:
            conn.execute(update(Run).where(Run.uid == rid).values(last_seen_at=then))
        out.append(Check("finished, then silent", "finished", status()))
        nope = client.post(f"/runs/{uuid.uuid4().hex}/heartbeat")
        out.append(Check("heartbeat of an unknown run", "404", str(nope.status_code)))
    return out
