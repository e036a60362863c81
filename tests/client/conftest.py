from __future__ import annotations

from pathlib import Path

import pytest

from noisescope._config import ENVIRONMENT
from noisescope.testing import MemoryTransport as FakeServer


@pytest.fixture
def fake() -> FakeServer:
    return FakeServer()


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test reads the developer's NOISESCOPE_* settings or writes to ~/.noisescope."""
    settings = [variable for variable, _ in ENVIRONMENT.values()]
    for name in (*settings, "NOISESCOPE_RUN_ID", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NOISESCOPE_DIR", str(tmp_path / "spool"))
    monkeypatch.setenv("NOISESCOPE_QUIET", "1")
