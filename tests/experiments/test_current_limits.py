"""The most a trend over the run could give "B_simple now" (``experiments.current_limits``): the
window's ratio of sums rescaled by the exact trend, on synthetic runs whose exact values are
known."""

from __future__ import annotations

import math
import random

import pytest

from experiments.current_limits import (
    exact_ratio,
    line_model,
    power_model,
    step_model,
    trend_limits,
)
from noisescope.estimators import NoiseSamples, interval_from_blocks

Points = list[tuple[float, float, float]]


def run(n: int, noise: float, seed: int = 0) -> tuple[Points, Points]:
    """Samples and exact values of a run whose |G|^2 falls 10x over its steps while tr(Sigma)
    stays at 1: B_simple grows from 10 to 100."""
    rng = random.Random(seed)
    truth = [(float(t), 0.1 * 10 ** (-t / n), 1.0) for t in range(n)]
    samples = [
        (t, g * (1.0 + rng.gauss(0.0, noise)), s * (1.0 + rng.gauss(0.0, noise)))
        for t, g, s in truth
    ]
    return samples, truth


def test_the_exact_trend_turns_the_window_into_the_value_now() -> None:
    samples, truth = run(2000, 0.05)
    now = exact_ratio(truth, 1800, 1999)
    assert now is not None and now > 80
    half, three_quarters, whole = trend_limits(samples, truth, 1800)
    assert (half.samples, three_quarters.samples, whole.samples) == (1000, 1500, 2000)
    for limit in (half, three_quarters, whole):
        assert limit.interval is not None and limit.states_number
        assert limit.interval.lo <= now <= limit.interval.hi
        assert limit.interval.value == pytest.approx(now, rel=0.05)
    # the window's own ratio is ruled by its oldest steps; the scale along the trend is not
    held = NoiseSamples()
    for sample in samples:
        held.add(*sample)
    flat = interval_from_blocks(*held.trailing(1000)).b_simple
    assert flat is not None and flat.value < 0.6 * now


def test_the_exact_trend_interval_covers_at_its_stated_rate() -> None:
    """Noisy runs (|G|^2 estimates with 3x their value as noise): the 90% interval of the
    scale along the exact trend covers B_simple now at about that rate over many seeds."""
    hits = stated = 0
    for seed in range(200):
        samples, truth = run(600, 3.0, seed=seed)
        now = exact_ratio(truth, 540, 599)
        assert now is not None
        (whole,) = trend_limits(samples, truth, 540, fractions=(1.0,))
        if whole.interval is None:
            continue
        stated += 1
        hits += whole.interval.lo <= now <= whole.interval.hi
    assert stated >= 190
    assert 0.84 <= hits / stated <= 0.96, (hits, stated)


def test_a_window_that_cannot_pin_the_gradient_gives_no_number() -> None:
    samples, truth = run(400, 30.0, seed=2)
    limits = trend_limits(samples, truth, 360)
    assert not any(limit.states_number for limit in limits)


def line_blocks(seed: int, m: int = 30, n: float = 20.0) -> tuple[list[float], ...]:
    """Blocks of a run's last half whose B_simple rises in a straight line from 50 to 100 at
    its last sample, |G|^2 = 1 with unit noise a sample, tr(Sigma) = B |G|^2 with 5% noise."""
    rng = random.Random(seed)
    ns, gs, ss = [], [], []
    for k in range(m):
        u = -0.5 + (k + 0.5) * 0.5 / m  # share of the run before its last sample
        b = 100.0 + 100.0 * u
        ns.append(n)
        gs.append(n + rng.gauss(0.0, math.sqrt(n)))
        ss.append(n * b * (1.0 + rng.gauss(0.0, 0.05 / math.sqrt(n))))
    return ns, gs, ss


def test_the_line_model_reads_a_straight_trend_at_the_last_sample_at_its_stated_rate() -> None:
    hits = stated = 0
    for seed in range(300):
        ns, gs, ss = line_blocks(seed)
        iv = line_model((ns, gs, ss), 2 * sum(ns))
        if iv is None:
            continue
        stated += 1
        hits += iv.lo <= 100.0 <= iv.hi
    assert stated >= 290
    # 90% intervals, within the Monte Carlo error of 300 runs (and the jackknife's own)
    assert 0.84 <= hits / stated <= 0.96, (hits, stated)
    # the window's ratio of sums is the trend's middle, not its end
    ns, gs, ss = line_blocks(0)
    assert sum(ss) / sum(gs) == pytest.approx(75.0, rel=0.1)


def power_blocks(
    seed: int, m: int = 30, n: float = 30.0
) -> tuple[list[float], list[float], list[float]]:
    """Blocks along which tr(Sigma) falls 10x and |G|^2 = 0.01 tr(Sigma)^1.5: B_simple now is
    100 tr(Sigma)_now^-0.5 = 100 at tr(Sigma)_now = 1."""
    rng = random.Random(seed)
    ns, gs, ss = [], [], []
    for k in range(m):
        s = 10.0 ** (1.0 - (k + 0.5) / m)
        ns.append(n)
        gs.append(n * 0.01 * s**1.5 + rng.gauss(0.0, 0.02 * math.sqrt(n)))
        ss.append(n * s * (1.0 + rng.gauss(0.0, 0.05 / math.sqrt(n))))
    return ns, gs, ss


def test_the_power_model_follows_the_gradient_down_with_tr_sigma() -> None:
    values = []
    for seed in range(40):
        iv = power_model(power_blocks(seed))
        assert iv is not None
        values.append(iv.value)
    # tr(Sigma) now is read over the last eighth of the blocks (a mean over a fall): the
    # model's B_simple now is that mean's, near 100 * 1.15^-0.5
    mean = sum(values) / len(values)
    assert 85.0 <= mean <= 105.0, mean


def step_run(seed: int, n: int = 800, noise: float = 0.3) -> Points:
    """Samples of a run along which |G|^2 = 0.1 (t/n)^-1 and tr(Sigma) = 2 (t/n)^-0.3 (t = step
    + 1), with noise of 3x |G|^2 now on each |G|^2 sample (some are negative): B_simple at the
    last step is 20, the run's ratio of sums far below."""
    rng = random.Random(seed)
    out = []
    for step in range(n):
        x = (step + 1) / n
        g_sq, trace_sigma = 0.1 * x**-1.0, 2.0 * x**-0.3
        out.append(
            (float(step), g_sq + rng.gauss(0.0, noise), trace_sigma * (1 + rng.gauss(0.0, 0.2)))
        )
    return out


def test_the_step_model_reads_a_power_law_at_the_last_step() -> None:
    hits = numbers = 0
    values = []
    for seed in range(200):
        iv = step_model(step_run(seed))
        assert iv is not None
        values.append(iv.value)
        numbers += iv.lo * 1.9 >= iv.value >= iv.hi / 1.9
        hits += iv.lo <= 20.0 <= iv.hi
    assert numbers >= 180
    # measured 162 of 200: the block jackknife of a nonlinear fit, over a window chosen by the
    # data, covers a little below its nominal 90% even where the model holds
    assert 0.75 <= hits / 200 <= 0.95, hits
    assert 17.0 <= sorted(values)[100] <= 23.0
    # the whole run's ratio of sums is the trend's past, not its end
    whole = step_run(0)
    assert sum(p[2] for p in whole) / sum(p[1] for p in whole) < 0.5 * 20.0


def test_a_change_no_power_law_follows_gives_no_number() -> None:
    """|G|^2 falls 100x at three quarters of the run (tr(Sigma) flat), and the last quarter is
    too noisy to pin it alone: the older steps disagree, so no number is stated."""
    for seed in range(20):
        rng = random.Random(seed)
        samples = [
            (float(t), (10.0 if t < 600 else 0.1) + rng.gauss(0.0, 1.0), 2.0 + rng.gauss(0.0, 0.4))
            for t in range(800)
        ]
        iv = step_model(samples)
        assert iv is None or not iv.lo * 1.9 >= iv.value >= iv.hi / 1.9, (seed, iv)
