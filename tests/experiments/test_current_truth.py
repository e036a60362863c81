""" "B_simple now" against its exact value (per-example gradients over a finite training set) on
a messy sweep: SGD with momentum and Adam, batch sizes 8-256, a divergent learning rate."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")

from experiments.current_truth import (
    TRUTH_EVERY,
    RunOutcome,
    render,
    run_study,
    study_runs,
    summary,
)


@pytest.fixture(scope="module")
def outcomes() -> list[RunOutcome]:
    return run_study(study_runs(quick=True), truth_every=TRUTH_EVERY)


def test_every_number_is_now_and_its_interval_holds_the_exact_value(
    outcomes: list[RunOutcome],
) -> None:
    s = summary(outcomes)
    assert s["numbers"] >= s["runs"] / 2  # most runs still get a number
    # every reported number within 2x of the exact value over the run's last 10% of steps
    assert s["within_2x"] == s["numbers"], render(outcomes, "test")
    # what is stated (a 90% interval, or a bound: the interval [bound, inf)) holds for the exact
    # value over its own window in at least 80% of the runs
    assert s["holds"] >= 0.8 * (s["numbers"] + s["bounds"]), render(outcomes, "test")


def test_a_diverged_run_has_no_number_borrowed_from_before(outcomes: list[RunOutcome]) -> None:
    diverged = [o for o in outcomes if o.diverged]
    assert diverged  # the grid's divergent corner is in the sweep
    for o in diverged:
        assert o.number is None or 0.5 <= o.number / o.exact_last <= 2.0
