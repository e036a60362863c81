"""Whatever the write path accepts, every read path can answer (issue 29): random bodies at the
edges of every field through every write route of a real server, then every read route about
what they made; no answer is a 5xx, nor a 422 blaming the database for what it stored
(harness/write_then_read.py)."""

from __future__ import annotations

import uuid

from hypothesis import HealthCheck, given, settings

from harness import AppServer, columns, run_body
from harness.write_then_read import (
    Story,
    read_everything,
    server_errors,
    stories,
    write_story,
)


def test_no_accepted_write_makes_a_read_fail(server: AppServer) -> None:
    with server.client() as c:

        @settings(
            max_examples=10,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(story=stories())
        def check(story: Story) -> None:
            failed = server_errors(write_story(c, story) + read_everything(c, story))
            assert not failed, failed

        check()


def test_steps_at_the_ends_of_int64_are_read_back(server: AppServer) -> None:
    """Steps 0 and 2^63 - 1 are valid; bucketing them for GET /series multiplied the span by
    max_points, past bigint on PostgreSQL ('bigint out of range', a 422 on a read)."""
    rid = uuid.uuid4().hex
    with server.client(prefix="/api/v1") as c:
        assert c.put(f"/runs/{rid}", json=run_body()).status_code == 201
        cols = columns(2)
        cols["step"] = [0, 2**63 - 1]
        assert c.post(f"/runs/{rid}/samples", json={"columns": cols}).status_code == 200
        (compared,) = c.get("/series", params={"runs": [rid]}).raise_for_status().json()
        one = c.get(f"/runs/{rid}/series").raise_for_status().json()
    assert sum(p["n"] for p in compared["points"]) == 2 == sum(p["n"] for p in one["points"])
