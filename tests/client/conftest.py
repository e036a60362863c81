from __future__ import annotations

from pathlib import Path

import pytest

from tests.client._fakes import FakeServer


@pytest.fixture
def fake() -> FakeServer:
    return FakeServer()


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test reads the developer's NOISESCOPE_* settings or writes to ~/.noisescope."""
    for name in (
        "NOISESCOPE_URL",
        "NOISESCOPE_TOKEN",
        "NOISESCOPE_MODE",
        "NOISESCOPE_DIR",
        "NOISESCOPE_FLUSH_TIMEOUT",
        "NOISESCOPE_ALL_RANKS",
        "NOISESCOPE_RUN_ID",
        "NOISESCOPE_DASHBOARD_URL",
        "RANK",
        "WORLD_SIZE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NOISESCOPE_DIR", str(tmp_path / "spool"))
    monkeypatch.setenv("NOISESCOPE_QUIET", "1")
