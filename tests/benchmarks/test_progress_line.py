"""``python -m benchmarks`` says how far it is on a terminal (a count and the time left) and
prints only its own lines elsewhere (issue 47 item 8)."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

import benchmarks.__main__ as benchmarks_main


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "log"])
def test_benchmarks_lines_carry_the_count_on_a_terminal_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, terminal: bool
) -> None:
    monkeypatch.setattr(benchmarks_main, "MODULES", [("absent_a", "A"), ("absent_b", "B")])
    stderr = _Terminal() if terminal else io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    out = tmp_path / "benchmarks.md"
    assert benchmarks_main.main(["--only", "absent_a", "absent_b", "--out", str(out)]) == 0
    said = stderr.getvalue()
    first, second = (f"[benchmarks] absent_{x}: {x.upper()} ..." for x in "ab")
    if terminal:
        assert f"{first} [0/2 · 0%]\n" in said and f"{second} [1/2 · 50%]\n" in said, said
    else:
        assert f"{first}\n" in said and f"{second}\n" in said, said
