"""A short PostgreSQL outage (a private cluster, stopped and started) makes requests wait
instead of failing: at most the queries running at the shutdown get a 503, none goes
unanswered."""

from __future__ import annotations

import pytest

from reliability._pg_outage import pg_binaries, run_outages


@pytest.mark.postgres
@pytest.mark.skipif(pg_binaries() is None, reason="no PostgreSQL server binaries (initdb)")
def test_a_short_outage_costs_waits_not_failures() -> None:
    (outage,) = run_outages([1.0], senders=2)
    assert outage.answers["200"] > 0
    assert set(outage.answers) <= {"200", "503"}, outage.answers
    assert outage.answers.get("503", 0) <= 2, outage.answers  # queries in flight at shutdown
