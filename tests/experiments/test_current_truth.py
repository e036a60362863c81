""" "B_simple now" against its exact value (per-example gradients over a finite training set) on
a messy sweep: SGD with momentum and Adam, batch sizes 8-256, a divergent learning rate, three
seeds.

These runs are chaotic: another CPU's float rounding gives other runs, so the test asserts the
study's figures with a margin of two or three runs each, not the exact counts that
``python -m experiments.current_truth`` writes to docs/reproduction.md (the acceptance record:
63 longer runs on digits and the byte LM, 9 of them held out).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")

from experiments.current_truth import RunOutcome, render, run_study, study_runs, summary

pytestmark = pytest.mark.slow  # 36 training runs, about 1.5 min

SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def outcomes() -> list[RunOutcome]:
    return run_study(study_runs(quick=True, seeds=SEEDS))


def test_numbers_are_now_and_what_is_stated_holds(outcomes: list[RunOutcome]) -> None:
    s = summary(outcomes)
    report = render(outcomes, "test")
    # a third of the runs or more get a number (16 of 36 here), the rest a bound or a reason
    assert s["numbers"] >= s["runs"] / 3, report
    # numbers are the recent value: within 2x of the exact value over the run's last 10% of
    # steps (16 of 16 on one CPU, 14 of 16 on an AVX-512 one: its rounding gives other runs;
    # the rule it replaced, grown back to the start: 20 of 29); two misses are allowed
    assert s["within_2x"] >= s["numbers"] - 2, report
    assert s["within_2x"] / s["numbers"] > s["previous_within_2x"] / s["previous_numbers"]
    # what is stated (a 90% interval, or a bound: the interval [bound, inf)) holds for the exact
    # value over its own window (31 of 33 here)
    assert s["holds"] >= 0.8 * (s["numbers"] + s["bounds"]), report


def test_a_diverged_run_has_no_number_borrowed_from_before(outcomes: list[RunOutcome]) -> None:
    diverged = [o for o in outcomes if o.diverged]
    assert diverged  # the grid's divergent corner is in the sweep
    for o in diverged:
        assert o.number is None or 0.5 <= o.number / o.exact_last <= 2.0
