"""noisescope.forecast: B_crit(L) = B* L^(-1/alpha_B) and the plateau of the local B_crit."""

from __future__ import annotations

import math

import pytest

from noisescope.forecast import fit_critical_batch_law, plateau


def test_the_law_recovers_kaplan_style_parameters_and_marks_extrapolation() -> None:
    b_star, alpha = 2e8, 0.21
    losses = [4.0, 3.5, 3.0, 2.8, 2.6]
    wiggle = [1.05, 0.97, 1.02, 0.96, 1.03]
    b_crits = [b_star * v ** (-1 / alpha) * w for v, w in zip(losses, wiggle, strict=True)]
    law = fit_critical_batch_law(
        losses, b_crits, [b / 1.3 for b in b_crits], [b * 1.3 for b in b_crits]
    )
    assert law.alpha_b is not None and law.alpha_b_lo is not None and law.alpha_b_hi is not None
    assert law.alpha_b_lo <= alpha <= law.alpha_b_hi
    assert law.alpha_b == pytest.approx(alpha, rel=0.15)
    inside = law.predict(3.2)
    assert not inside.extrapolation
    assert inside.b_crit_lo <= b_star * 3.2 ** (-1 / alpha) <= inside.b_crit_hi
    beyond = law.predict(2.0)
    assert beyond.extrapolation
    # the interval widens away from the data
    assert beyond.b_crit_hi / beyond.b_crit_lo > inside.b_crit_hi / inside.b_crit_lo


def test_a_critical_batch_that_does_not_grow_as_loss_falls_has_no_exponent() -> None:
    law = fit_critical_batch_law([3.0, 2.0, 1.0], [100.0, 80.0, 50.0])
    assert law.alpha_b is None and law.reason is not None and "does not grow" in law.reason


def test_a_flat_noisy_law_is_not_significant() -> None:
    law = fit_critical_batch_law([3.0, 2.9, 2.8], [100.0, 140.0, 101.0])
    assert law.alpha_b is not None and law.alpha_b_lo is None
    assert law.reason is not None and "not significantly" in law.reason


def test_bad_law_input_says_what_to_fix() -> None:
    with pytest.raises(ValueError, match="3 or more distinct losses"):
        fit_critical_batch_law([1.0, 1.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="finite and positive"):
        fit_critical_batch_law([1.0, 2.0, math.nan], [1.0, 2.0, 3.0])
    law = fit_critical_batch_law([3.0, 2.0, 1.0], [10.0, 30.0, 100.0])
    with pytest.raises(ValueError, match="loss must be positive"):
        law.predict(-1.0)


def test_plateau_finds_where_the_local_critical_batch_stops_growing() -> None:
    steps = [0, 100, 200, 400, 800]
    values = [2.0, 10.0, 40.0, 45.0, 42.0]
    lo = [1.0, 7.0, 30.0, 33.0, 31.0]
    hi = [3.0, 14.0, 55.0, 60.0, 58.0]
    found = plateau(steps, values, lo, hi)
    assert found.step == 200 and found.b_crit == 40.0
    rising = plateau(steps, [1, 2, 4, 8, 16], [0.9, 1.8, 3.6, 7.2, 14], [1.1, 2.2, 4.4, 8.8, 18])
    assert rising.step is None and rising.reason is not None and "still rising" in rising.reason
    assert plateau([0, 1], [1.0, 2.0], [None, None], [None, None]).step is None
