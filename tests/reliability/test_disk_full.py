"""The disk-full section of ``python -m reliability`` at CI size: a 512 KiB tmpfs (where this
process may mount one) and ENOSPC injected at each point, through the real server and sync."""

from __future__ import annotations

import pytest

from reliability._disk_full import run_disk_full

pytestmark = pytest.mark.slow


def test_every_disk_full_scenario_holds() -> None:
    ok, rows, skipped = run_disk_full(burst=30_000)
    assert ok, [row for row in rows if row["held"] != "yes"]
    assert len(rows) == (6 if skipped else 8)
