"""docs/branching.md's example runs, resumes, and says what it measured."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(store: Path, *extra: str) -> subprocess.CompletedProcess[str]:
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
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr
    return out


def test_the_branching_example_measures_and_resumes(tmp_path: Path) -> None:
    first = _run(tmp_path / "store").stdout
    pattern = (
        r"step (\d+): loss [\d.]+, local critical batch (.+?) "
        r"\((\d+) branches trained, (\d+) reused\)"
    )
    lines = re.findall(pattern, first)
    assert [(s, t, r) for s, _, t, r in lines] == [("10", "10", "0"), ("50", "10", "0")]
    assert all(re.match(r"(\d+ \[\d+, (\d+|inf)\]|> \d+)$", v) for _, v, _, _ in lines)
    again = _run(tmp_path / "store").stdout
    assert again.count("0 branches trained, 10 reused") == 2
    assert first.splitlines()[-1] == again.splitlines()[-1]  # the parent ends the same
    assert "docs/branching.md" in (ROOT / "examples" / "branching.py").read_text()
    doc = (ROOT / "docs" / "branching.md").read_text()
    assert "python examples/branching.py" in doc


@pytest.mark.slow
def test_the_documented_command_runs_as_written(tmp_path: Path) -> None:
    """docs/branching.md's command, its store in a temporary folder: branches at steps 20 and
    200, the local critical batch at each (an interval, or a bound where the largest branches
    still gain), the parent finished; run again, every branch is reused."""
    doc = (ROOT / "docs" / "branching.md").read_text()
    (command,) = re.findall(r"```bash\n(python examples/branching\.py[^\n]*)\n```", doc)
    args = command.replace("/tmp/branches", str(tmp_path / "branches")).split()[1:]

    def run() -> str:
        done = subprocess.run(
            [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=240,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    first = run()
    pattern = r"step (\d+): loss [\d.]+, local critical batch (.+?) \((\d+) branches trained"
    lines = re.findall(pattern, first)
    assert [(step, trained) for step, _, trained in lines] == [("20", "15"), ("200", "15")]
    assert all(re.match(r"(\d+ \[\d+, (\d+|inf)\]|> \d+)$", v) for _, v, _ in lines), first
    assert re.search(r"^parent finished at step 400, loss [\d.]+$", first, flags=re.M), first
    again = run()
    assert again.count("(0 branches trained, 15 reused)") == 2, again


def test_with_a_server_the_parent_is_a_run_and_the_branches_are_its_children(
    tmp_path: Path,
) -> None:
    """Issue 56 item 6: ``--url`` logs the parent (measured by a probe) and links every branch
    run to it, so its Run page draws the branches; the terminal gets the parent's link and a
    line per branch point, not a line per branch run."""
    from harness import ServerProcess

    with ServerProcess() as server:
        done = _run(tmp_path / "store", "--url", server.url)
        with server.api() as api:
            runs = api.runs(project="examples", current=False)
            (parent,) = [r for r in runs if r.parent_uid is None]
            children = [r for r in runs if r.parent_uid is not None]
            branches = api.branches(parent.uid)
    assert parent.n_samples == 60 and parent.status == "finished"
    assert len(children) == 2 * 5 * 2  # branch points x multipliers x seeds
    assert {r.parent_uid for r in children} == {parent.uid}
    assert [p.step for p in branches.points] == [10, 50]
    assert len((done.stdout + done.stderr).splitlines()) <= 5, done.stdout + done.stderr
    assert "8000" not in (ROOT / "examples" / "branching.py").read_text()
