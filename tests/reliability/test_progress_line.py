"""``python -m reliability`` says how far it is on a terminal (a count and the time left) and
prints only its own lines elsewhere (issue 47 item 8)."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

import reliability.__main__ as reliability_main


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "log"])
def test_reliability_counts_its_sections_on_a_terminal_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, terminal: bool
) -> None:
    monkeypatch.setattr(reliability_main, "disk_section", lambda: (True, "held"))
    stderr = _Terminal() if terminal else io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    out = tmp_path / "reliability.md"
    assert reliability_main.main(["--only", "disk", "--backends", "sqlite", "--out", str(out)]) == 0
    said = stderr.getvalue()
    assert "[reliability] Disk full (the client's spool): ok\n" in said
    assert ("\r[reliability] [0/1 · 0%] Disk full (the client's spool)" in said) is terminal
    assert ("\r" in said) is terminal
    assert "| Disk full (the client's spool) | yes |" in out.read_text()
