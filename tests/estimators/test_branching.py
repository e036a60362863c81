"""estimators.local_critical_batch: the crossing read no finer than the batch-size grid resolves
(docs/science.md, "Measuring the critical batch size directly (branching)")."""

from __future__ import annotations

import math

import pytest

from noisescope.estimators import MAX_RESOLVED_JUMP, local_critical_batch

BASE = [1.0, 1.2, 0.9]


def _scaled(factors: list[float]) -> list[list[float]]:
    """Paired seeds: every batch size's losses are the reference's times a factor, plus a
    small seed-dependent wiggle so the seeds have a spread."""
    return [[v * f + 1e-4 * (j - 1) * i for j, v in enumerate(BASE)] for i, f in enumerate(factors)]


def test_a_crossing_between_the_first_two_batch_sizes_is_a_bracket() -> None:
    # digits-sqrt's first branch points: the first doubling already overshoots by ~30 ε, and
    # the old reading put the crossing at 16.3 [16.3–16.4].
    est = local_critical_batch([16, 32, 64, 128], _scaled([1.0, 1.3, 1.6, 2.0]), epsilon=0.01)
    assert est.b_crit is None
    assert (est.b_crit_lo, est.b_crit_hi) == (16, 32)
    assert est.b_crit_interpolated is not None and 16 < est.b_crit_interpolated < 17
    assert est.reason is not None
    assert "between 16 and 32" in est.reason
    assert "smaller base batch" in est.reason and "finer multipliers" in est.reason


def test_a_jump_of_many_epsilon_across_a_later_cell_is_a_bracket() -> None:
    # Inside the tolerance at 16 and 32, then 20 ε above it at 64: not resolved between 32 and 64.
    est = local_critical_batch([16, 32, 64], _scaled([1.0, 1.002, 1.2]), epsilon=0.01)
    assert est.b_crit is None and (est.b_crit_lo, est.b_crit_hi) == (32, 64)
    assert est.reason is not None and "between 32 and 64" in est.reason
    assert "finer multipliers" in est.reason


def test_a_diverged_batch_right_after_the_last_good_one_is_a_bracket() -> None:
    est = local_critical_batch([1, 2, 4], [BASE, BASE, [math.inf] * 3], epsilon=0.01)
    assert est.b_crit is None and (est.b_crit_lo, est.b_crit_hi) == (2, 4)


def test_a_resolved_crossing_is_a_number_and_its_interval_spans_the_grid_cell() -> None:
    # D/(ε L0) = -1, -0.5, +0.5, +2: the loss rises by one ε across the cell 32-64.
    est = local_critical_batch([16, 32, 64, 128], _scaled([1.0, 1.005, 1.015, 1.03]), epsilon=0.01)
    assert est.b_crit is not None and est.b_crit == pytest.approx(math.sqrt(32 * 64), rel=0.05)
    assert est.b_crit_interpolated == est.b_crit
    assert est.b_crit_lo is not None and est.b_crit_hi is not None
    # the seeds alone would give a far narrower interval; the grid cannot resolve inside 32-64
    assert est.b_crit_lo <= 32 and est.b_crit_hi >= 64


def test_the_jump_threshold_separates_resolved_from_bracketed() -> None:
    def jump(j: float) -> float | None:
        # D/(ε L0) = -1 at 16, -0.5 at 32, then -0.5 + j at 64
        return local_critical_batch(
            [16, 32, 64], [[1.0], [1.005], [1.005 + 0.01 * j]], epsilon=0.01
        ).b_crit

    assert jump(MAX_RESOLVED_JUMP * 0.9) is not None
    assert jump(MAX_RESOLVED_JUMP * 1.1) is None


def test_one_seed_still_gives_the_bracket_from_the_grid() -> None:
    est = local_critical_batch([16, 32, 64], [[1.0], [1.3], [1.6]], epsilon=0.01)
    assert est.b_crit is None and (est.b_crit_lo, est.b_crit_hi) == (16, 32)
    assert est.reason is not None and "one seed" in est.reason
