"""The one definition of a run's current B_simple (``estimators.current_window``)."""

from __future__ import annotations

import math
import random

import pytest

from noisescope.estimators import (
    CURRENT_FRACTION,
    CURRENT_MAX_REL_WIDTH,
    CURRENT_MIN_SAMPLES,
    current_window,
    interval_from_blocks,
)


def noisy_steps(n: int, b_simple: float, noise: float, seed: int = 0) -> tuple[list[float], ...]:
    """Per-step unbiased estimates around |G|^2 = 1, tr(Sigma) = b_simple."""
    rng = random.Random(seed)
    g_sq = [1.0 + rng.gauss(0, noise) for _ in range(n)]
    trace_sigma = [b_simple + rng.gauss(0, noise * b_simple) for _ in range(n)]
    return [1.0] * n, g_sq, trace_sigma


def test_below_the_minimum_there_is_no_number_and_the_reason_says_why() -> None:
    k, interval = current_window(*noisy_steps(CURRENT_MIN_SAMPLES - 1, 50.0, 0.01))
    assert k == 0
    assert interval.b_simple is None
    assert interval.reason is not None
    assert f"{CURRENT_MIN_SAMPLES - 1} samples so far" in interval.reason
    assert str(CURRENT_MIN_SAMPLES) in interval.reason


def test_a_quiet_run_uses_its_most_recent_fraction() -> None:
    n = 5000
    k, interval = current_window(*noisy_steps(n, 50.0, 0.05))
    assert k == math.ceil(CURRENT_FRACTION * n)
    assert interval.b_simple is not None
    assert interval.b_simple.value == pytest.approx(50.0, rel=0.05)
    # it is exactly the block interval of those last k samples
    n_b, g, s = noisy_steps(n, 50.0, 0.05)
    assert interval == interval_from_blocks(n_b[-k:], g[-k:], s[-k:])


def test_a_noisy_run_grows_its_window_until_the_interval_is_narrow_enough() -> None:
    n = 20_000
    k, interval = current_window(*noisy_steps(n, 50.0, 20.0, seed=3))
    assert k > math.ceil(CURRENT_FRACTION * n)
    assert interval.b_simple is not None
    width = interval.b_simple.hi - interval.b_simple.lo
    assert width <= CURRENT_MAX_REL_WIDTH * interval.b_simple.value or k == n
    # the half-size window was still too wide: the rule takes the smallest that is not
    n_b, g, s = noisy_steps(n, 50.0, 20.0, seed=3)
    half = interval_from_blocks(n_b[-(k // 2) :], g[-(k // 2) :], s[-(k // 2) :]).b_simple
    assert half is None or half.hi - half.lo > CURRENT_MAX_REL_WIDTH * half.value


def test_a_run_whose_gradient_is_all_noise_is_not_measurable() -> None:
    rng = random.Random(1)
    n = 1000
    g_sq = [rng.gauss(0, 1.0) for _ in range(n)]
    trace_sigma = [100.0 + rng.gauss(0, 10.0) for _ in range(n)]
    k, interval = current_window([1.0] * n, g_sq, trace_sigma)
    assert k == n  # grown to the whole run, and still nothing to say
    assert interval.b_simple is None
    assert interval.reason is not None and "not" in interval.reason


def test_blocks_count_by_their_samples() -> None:
    """64-sample storage blocks: the window takes whole blocks from the end."""
    blocks = 100
    n_b = [64.0] * blocks
    g = [64.0] * blocks
    s = [64.0 * 30] * blocks
    k, interval = current_window(n_b, g, s)
    assert k == math.ceil(CURRENT_FRACTION * blocks * 64 / 64)
    assert interval.b_simple is not None and interval.b_simple.value == pytest.approx(30.0)
