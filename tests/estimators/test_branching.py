"""estimators.local_critical_batch: the crossing read no finer than the batch-size grid resolves
(docs/science.md, "Measuring the critical batch size directly (branching)")."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from noisescope.estimators import MAX_RESOLVED_JUMP, branch_mean_loss, local_critical_batch

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


_FINITE = st.floats(min_value=-1.7e308, max_value=1.7e308) | st.sampled_from(
    [0.0, 5e-324, 1e-300, 1e154, 1e308, 1.7e308]
)


@settings(max_examples=300, deadline=None)
@given(
    epsilon=st.floats(min_value=5e-324, max_value=1.7e308),
    sizes=st.lists(
        st.floats(min_value=5e-324, max_value=1.7e308), min_size=2, max_size=4, unique=True
    ),
    data=st.data(),
)
def test_any_finite_losses_give_an_answer_never_an_arithmetic_error(
    epsilon: float, sizes: list[float], data: st.DataObject
) -> None:
    """Stored branch losses are any finite numbers (the server reads them back): near 1e154 the
    seeds' spread once overflowed (a 500 on GET /runs/{id}/branches)."""
    sizes = sorted(sizes)  # the smallest is the reference: its losses are finite
    finite = st.lists(_FINITE, min_size=1, max_size=3)
    losses = [data.draw(finite) for _ in sizes]
    losses[1:] = [row if data.draw(st.booleans()) else [math.inf] * len(row) for row in losses[1:]]
    est = local_critical_batch(sizes, losses, epsilon=epsilon)
    for end in (est.b_crit, est.b_crit_lo, est.b_crit_hi):
        assert end is None or min(sizes) <= end <= max(sizes)


def test_the_mean_loss_of_a_batch_size_is_inf_when_a_seed_diverged() -> None:
    assert branch_mean_loss([1.0, 2.0, 4.5]) == 2.5
    assert branch_mean_loss([1.0, math.nan]) == math.inf
    assert branch_mean_loss([1.0, -math.inf]) == math.inf
    assert branch_mean_loss([1e308, 1.5e308]) == pytest.approx(1.25e308)  # no overflow
    est = local_critical_batch([1, 2, 4], [BASE, [1.0, 1.02, 1.04], [math.inf] * 3])
    assert est.mean_loss == pytest.approx((branch_mean_loss(BASE), 1.02, math.inf))


def test_a_huge_loss_is_read_like_any_other_scale() -> None:
    small = local_critical_batch([16, 32, 64, 128], _scaled([1.0, 1.005, 1.015, 1.03]))
    big = local_critical_batch(
        [16, 32, 64, 128],
        [[v * 2.0**600 for v in row] for row in _scaled([1.0, 1.005, 1.015, 1.03])],
    )
    assert (big.b_crit, big.b_crit_lo, big.b_crit_hi) == (
        small.b_crit,
        small.b_crit_lo,
        small.b_crit_hi,
    )
