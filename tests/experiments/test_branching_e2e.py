"""``python -m experiments.branching`` end to end on digits (no sweep): real training, real
client, real server; it writes only its own section, and the server agrees with the study."""

from __future__ import annotations

from pathlib import Path

import noisescope
from experiments.branching import BRANCH_TASKS, main
from harness import ServerProcess


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


def test_the_branch_following_schedule_counts_what_its_branches_cost() -> None:
    """schedule_experiment's "branch" variant: the batch follows the branch measurement and
    the examples the branches trained on count toward the run's examples."""
    from experiments.branching import SCHEDULE_BRANCH_STEPS, SCHEDULE_MULTIPLIERS, SCHEDULE_SEEDS
    from experiments.schedule_experiment import run_schedule
    from experiments.tasks import TASKS

    spec = TASKS["digits"].sized(True)
    trace = run_schedule(spec, 0.2, 0.8, 0, (1.0,), "branch")
    assert 1.0 in trace.reached
    step, examples = trace.reached[1.0]
    first = SCHEDULE_BRANCH_STEPS[0]
    # at least the first branch point's cost: its branches at the smallest batch
    cost = len(SCHEDULE_MULTIPLIERS) * SCHEDULE_SEEDS * spec.batch_sizes[0] * 16 * 4
    assert step > first and examples >= cost
