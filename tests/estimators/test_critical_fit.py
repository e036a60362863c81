"""The S-E fit (``fit_critical_batch``) and the parallelism helpers against closed forms."""

from __future__ import annotations

import math
import random

import pytest

from noisescope.estimators import (
    compute_waste,
    doubling_speedup,
    fit_critical_batch,
    parallelism_limit,
    steps_ratio,
)

SIZES = [16.0, 32.0, 64.0, 128.0, 256.0, 512.0]


def test_exact_points_give_b_crit_and_a_zero_width_interval() -> None:
    fit = fit_critical_batch(SIZES, [100 * steps_ratio(b, 200.0) for b in SIZES])
    assert fit.b_crit == pytest.approx(200.0)
    assert fit.s_min == pytest.approx(100.0)
    assert fit.e_min == pytest.approx(20_000.0)
    assert fit.b_crit_lo == pytest.approx(200.0) and fit.b_crit_hi == pytest.approx(200.0)
    assert fit.reason is None


def test_the_fieller_interval_covers_at_its_level() -> None:
    rng = random.Random(11)
    trials, covered = 400, 0
    for _ in range(trials):
        steps = [100 * steps_ratio(b, 200.0) * math.exp(rng.gauss(0, 0.1)) for b in SIZES]
        fit = fit_critical_batch(SIZES, steps, level=0.9)
        lo = fit.b_crit_lo if fit.b_crit_lo is not None else -math.inf
        hi = fit.b_crit_hi if fit.b_crit_hi is not None else math.inf
        covered += lo <= 200.0 <= hi
    assert 0.85 <= covered / trials <= 0.95


def test_points_that_do_not_fall_with_the_batch_give_no_b_crit() -> None:
    fit = fit_critical_batch([16, 64, 256], [100.0, 120.0, 150.0])  # steps rise with B
    assert fit.b_crit is None
    assert fit.reason is not None and "do not follow" in fit.reason


def test_steps_proportional_to_one_over_b_leave_b_crit_undetermined() -> None:
    rng = random.Random(2)
    steps = [1e5 / b * math.exp(rng.gauss(0, 0.05)) for b in SIZES]  # B << B_crit
    fit = fit_critical_batch(SIZES, steps)
    assert fit.b_crit_lo is None or fit.b_crit is None


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="3 distinct"):
        fit_critical_batch([16, 16, 32], [1, 2, 3])
    with pytest.raises(ValueError, match="positive"):
        fit_critical_batch([16, 32, 64], [1, 0, 3])


def test_parallelism_limit_is_where_doubling_stops_paying() -> None:
    for b_crit, per_device, speedup in ((2000.0, 32.0, 1.5), (500.0, 8.0, 1.8), (1e6, 512, 1.2)):
        limit = parallelism_limit(b_crit, per_device, speedup)
        assert doubling_speedup(limit * per_device, b_crit) == pytest.approx(speedup)
        assert doubling_speedup(0.9 * limit * per_device, b_crit) > speedup
    # at the default 1.5x the batch is B_crit / 2 and a third of the compute is beyond minimum
    assert parallelism_limit(2000.0, 1.0) == pytest.approx(1000.0)
    assert compute_waste(1000.0, 2000.0) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="between 1 and 2"):
        parallelism_limit(100.0, 1.0, 2.0)
