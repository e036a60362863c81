"""``python -m experiments.branching`` end to end on digits (no sweep): real training, real
client, real server; it writes only its own section, and the server agrees with the study."""

from __future__ import annotations

from pathlib import Path

import noisescope
from experiments.branching import BRANCH_TASKS, main
from tests.support.servers import ServerProcess


def test_branching_study_writes_its_section_and_the_server_agrees(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "reproduction.md").write_text("# Reproduction\n\nthe sweep study\n")
    out = tmp_path / "runs"
    assert main(["--tasks", "digits", "--no-sweep", "--out", str(out), "--docs", str(docs)]) == 0
    page = (docs / "reproduction.md").read_text()
    assert page.startswith("# Reproduction\n\nthe sweep study\n")
    assert page.count("<!-- section:branching -->") == 1
    rows = [line for line in page.splitlines() if line.startswith("| ") and "|---" not in line]
    setup = BRANCH_TASKS["digits"]
    steps = [line.split("|")[1].strip() for line in rows if line.split("|")[1].strip().isdigit()]
    assert steps == [str(s) for s in setup.branch_steps]
    assert (docs / "figures" / "branching_digits.png").stat().st_size > 1000
    with ServerProcess(database_url=f"sqlite:///{out / 'full' / 'noisescope.db'}") as server:
        api = noisescope.Api(server.url)
        parent = next(r for r in api.runs(search="branching parent digits"))
        answer = api.branches(parent.uid)
    assert [p.step for p in answer.points] == list(setup.branch_steps)
    assert all(p.n_runs == len(setup.multipliers) * setup.seeds for p in answer.points)
    for p in answer.points:
        assert f"| {p.step} | {p.parent_loss:.3g} |" in page
