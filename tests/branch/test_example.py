"""docs/branching.md's example runs, resumes, and says what it measured."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(store: Path) -> str:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "branching.py"),
            "--steps",
            "60",
            "--branch-at",
            "10,50",
            "--seeds",
            "2",
            "--store",
            str(store),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_branching_example_measures_and_resumes(tmp_path: Path) -> None:
    first = _run(tmp_path / "store")
    pattern = (
        r"step (\d+): loss [\d.]+, local critical batch (.+?) "
        r"\((\d+) branches trained, (\d+) reused\)"
    )
    lines = re.findall(pattern, first)
    assert [(s, t, r) for s, _, t, r in lines] == [("10", "10", "0"), ("50", "10", "0")]
    assert all(re.match(r"(\d+ \[\d+, (\d+|inf)\]|> \d+)$", v) for _, v, _, _ in lines)
    again = _run(tmp_path / "store")
    assert again.count("0 branches trained, 10 reused") == 2
    assert first.splitlines()[-1] == again.splitlines()[-1]  # the parent ends the same
    assert "docs/branching.md" in (ROOT / "examples" / "branching.py").read_text()
    doc = (ROOT / "docs" / "branching.md").read_text()
    assert "python examples/branching.py" in doc
