"""The one definition of a run's current B_simple (``estimators.current_noise_scale``)."""

from __future__ import annotations

import math
import random

import pytest

from noisescope import estimators
from noisescope.estimators import (
    NoiseSamples,
    current_window,
    interval_from_blocks,
)


def noisy_steps(
    n: int, b_simple: float, noise: float, seed: int = 0, g_sq: float = 1.0
) -> tuple[list[float], ...]:
    """Per-step unbiased estimates around |G|^2 = g_sq, tr(Sigma) = b_simple * g_sq."""
    rng = random.Random(seed)
    g = [g_sq * (1.0 + rng.gauss(0, noise)) for _ in range(n)]
    trace_sigma = [g_sq * (b_simple + rng.gauss(0, noise * b_simple)) for _ in range(n)]
    return [1.0] * n, g, trace_sigma


def test_below_the_minimum_there_is_no_number_and_the_reason_says_why() -> None:
    k, window = current_window(*noisy_steps(estimators.CURRENT_MIN_SAMPLES - 1, 50.0, 0.01))
    assert k == 0
    assert window.b_simple is None and window.lower_bound is None
    reason = window.interval.reason
    assert reason is not None
    assert f"{estimators.CURRENT_MIN_SAMPLES - 1} samples so far" in reason
    assert str(estimators.CURRENT_MIN_SAMPLES) in reason


def test_a_quiet_run_uses_its_most_recent_fraction() -> None:
    n = 5000
    k, window = current_window(*noisy_steps(n, 50.0, 0.05))
    assert k == math.ceil(estimators.CURRENT_FRACTION * n)
    assert window.b_simple == pytest.approx(50.0, rel=0.05)
    assert window.limit is None
    # it is exactly the block interval of those last k samples
    n_b, g, s = noisy_steps(n, 50.0, 0.05)
    assert window.interval == interval_from_blocks(n_b[-k:], g[-k:], s[-k:])


def test_a_noisy_steady_run_grows_its_window_until_the_interval_is_narrow_enough() -> None:
    n = 20_000
    k, window = current_window(*noisy_steps(n, 50.0, 12.0, seed=3))
    assert (
        math.ceil(estimators.CURRENT_FRACTION * n)
        < k
        <= math.ceil(estimators.CURRENT_MAX_FRACTION * n)
    )
    b_iv = window.interval.b_simple
    assert b_iv is not None
    assert b_iv.hi - b_iv.lo <= estimators.CURRENT_MAX_REL_WIDTH * b_iv.value
    # the half-size window was still too wide: the rule takes the smallest that is not
    n_b, g, s = noisy_steps(n, 50.0, 12.0, seed=3)
    half = interval_from_blocks(n_b[-(k // 2) :], g[-(k // 2) :], s[-(k // 2) :]).b_simple
    assert half is None or half.hi - half.lo > estimators.CURRENT_MAX_REL_WIDTH * half.value


def test_the_window_never_reaches_back_across_a_change_of_regime() -> None:
    """Early training: |G|^2 1000x larger and B_simple 30x smaller. A ratio of sums that took in
    those steps would come out near the early value; the window stops at the change instead."""
    n_early, n_late = 7000, 3000
    early = noisy_steps(n_early, 10.0, 0.3, seed=1, g_sq=1000.0)
    late = noisy_steps(n_late, 300.0, 12.0, seed=2)
    blocks = tuple(a + b for a, b in zip(early, late, strict=True))
    assert len(blocks) == 3  # (block_n, block_sum_g_sq, block_sum_trace_sigma)
    k, window = current_window(*blocks)
    assert k <= n_late  # no sample from before the change
    whole = interval_from_blocks(*blocks).b_simple
    assert whole is not None and whole.value < 20  # what borrowing the past would say
    if window.b_simple is not None:
        assert 150 < window.b_simple < 600
    else:
        assert window.lower_bound is not None and window.lower_bound < 300
    assert window.limit is not None and "changed regime" in window.limit


def test_a_run_whose_gradient_is_all_noise_gives_a_lower_bound_from_its_recent_half() -> None:
    rng = random.Random(2)
    n = 1000
    g_sq = [rng.gauss(0.01, 1.0) for _ in range(n)]
    trace_sigma = [100.0 + rng.gauss(0, 10.0) for _ in range(n)]
    k, window = current_window([1.0] * n, g_sq, trace_sigma)
    assert k <= math.ceil(estimators.CURRENT_MAX_FRACTION * n)  # the cap, not the whole run
    assert window.b_simple is None
    bound = window.lower_bound
    assert bound is not None and bound > 0 and window.point == bound
    reason = window.interval.reason
    assert reason is not None and reason.startswith("B_simple ≥")


def test_the_lower_bound_holds_at_its_confidence() -> None:
    """True |G|^2 = 0.05, tr(Sigma) = 100 (B_simple = 2000), per-step noise far above the signal:
    over many runs the bound lies below the truth at least 90% of the time."""
    below = total = 0
    for seed in range(200):
        rng = random.Random(seed)
        n = 400
        g_sq = [0.05 + rng.gauss(0, 1.0) for _ in range(n)]
        trace_sigma = [100.0 + rng.gauss(0, 10.0) for _ in range(n)]
        _, window = current_window([1.0] * n, g_sq, trace_sigma)
        bound = window.lower_bound
        if window.b_simple is None and bound is not None:
            total += 1
            below += bound <= 2000.0
    assert total > 100
    assert below / total >= 0.9


def test_blocks_count_by_their_samples() -> None:
    """64-sample storage blocks: the window takes whole blocks from the end."""
    blocks = 100
    n_b = [64.0] * blocks
    g = [64.0] * blocks
    s = [64.0 * 30] * blocks
    k, window = current_window(n_b, g, s)
    assert k == math.ceil(estimators.CURRENT_FRACTION * blocks * 64 / 64)
    assert window.b_simple == pytest.approx(30.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_in_memory_samples_give_the_rule_s_answer_on_raw_samples(seed: int) -> None:
    """``NoiseSamples`` (the training loop's store: prefix sums cut into at most 256 blocks)
    gives the same window and the same number as the rule on the raw samples, to rounding."""
    early = noisy_steps(3000, 10.0, 0.3, seed=seed, g_sq=50.0)
    late = noisy_steps(3000, 200.0, 15.0, seed=seed + 10)
    n_b, g, s = (a + b for a, b in zip(early, late, strict=True))
    samples = NoiseSamples()
    for i, (g_i, s_i) in enumerate(zip(g, s, strict=True)):
        samples.add(i, g_i, s_i)
    mine = samples.current()
    _, raw = current_window(n_b, g, s)
    assert mine.n == raw.n
    assert (mine.b_simple is None) == (raw.b_simple is None)
    if raw.b_simple is not None:
        assert mine.b_simple == pytest.approx(raw.b_simple, rel=1e-9)
    assert samples.steps(mine) == (len(g) - mine.n, len(g) - 1)
    restored = NoiseSamples.from_state(samples.state()).current()
    assert restored.n == mine.n and restored.point == pytest.approx(mine.point, rel=1e-9)


def test_a_number_is_stated_only_within_a_factor_two_else_its_lower_end() -> None:
    """A short run whose interval spans more than 2x either side of its value: the answer is
    the interval's lower end as a bound, never the point it cannot vouch for."""
    n_b, g, s = noisy_steps(64, 50.0, 2.0, seed=1)
    measured = interval_from_blocks(
        n_b, g, s, max_blocks=64 // estimators.CURRENT_MIN_BLOCK
    ).b_simple
    assert measured is not None
    assert measured.hi > estimators.CURRENT_MAX_FACTOR * measured.value  # too wide to state
    _, window = current_window(n_b, g, s)
    assert window.b_simple is None
    assert window.lower_bound == measured.lo
    reason = window.interval.reason
    assert reason is not None and reason.startswith("B_simple ≥") and "too wide" in reason
