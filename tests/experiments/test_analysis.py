"""The reproduction's analysis: crossings, best lr per batch, the fit, B_simple at a loss."""

from __future__ import annotations

import math

import pytest

from experiments.analysis import (
    LossCurve,
    NoiseSamples,
    SweepRun,
    b_simple_at_loss,
    best_per_batch,
    critical_batch_rows,
    crossing_step,
    ema,
    noise_scale_curve,
    window_noise_scale,
)


def test_crossing_step_interpolates_between_evaluations() -> None:
    assert crossing_step([0, 10, 20], [3.0, 2.0, 1.0], 1.5) == pytest.approx(15.0)
    assert crossing_step([0, 10, 20], [3.0, 2.0, 1.0], 2.0) == pytest.approx(10.0)


def test_crossing_step_is_the_first_crossing_and_none_if_never() -> None:
    assert crossing_step([0, 10, 20, 30], [3.0, 1.0, 2.0, 0.5], 1.5) == pytest.approx(7.5)
    assert crossing_step([0, 10], [3.0, 2.0], 1.0) is None
    assert crossing_step([0, 10, 20], [3.0, math.nan, 1.0], 2.0) == pytest.approx(20.0)


def test_ema_is_debiased() -> None:
    assert ema([2.0, 2.0, 2.0], 0.9) == pytest.approx([2.0, 2.0, 2.0])
    assert ema([0.0, 10.0], 0.5)[1] == pytest.approx(10.0 * 0.5 / 0.75)


def _linear_curve(steps_to_target: float, target: float = 1.0) -> LossCurve:
    """Loss falling linearly from 2 to 0 so that it crosses ``target`` at ``steps_to_target``."""
    slope = (2.0 - target) / steps_to_target
    end = 2.0 / slope
    steps = [end * i / 100 for i in range(101)]
    return LossCurve(steps, [2.0 - slope * s for s in steps])


def _samples(
    n_steps: int, g_sq: float, trace_sigma: float, b_small: float, b_big: float
) -> NoiseSamples:
    """Noise-free two-batch samples: |G_B|^2 = |G|^2 + tr(Sigma)/B exactly (science.md eq. 1)."""
    steps = [float(s) for s in range(1, n_steps + 1)]
    return NoiseSamples(
        step=steps,
        b_small=[b_small] * n_steps,
        b_big=[b_big] * n_steps,
        g_small_sq=[g_sq + trace_sigma / b_small] * n_steps,
        g_big_sq=[g_sq + trace_sigma / b_big] * n_steps,
    )


def test_best_per_batch_keeps_the_fastest_lr_and_averages_repeats() -> None:
    runs = [
        SweepRun("a0", 8, 0.1, _linear_curve(100), seed=0),
        SweepRun("a1", 8, 0.1, _linear_curve(120), seed=1),
        SweepRun("b0", 8, 0.2, _linear_curve(90), seed=0),
        SweepRun("b1", 8, 0.2, _linear_curve(200), seed=1),
        # A faster lr that one repeat never got to the target does not count.
        SweepRun("c0", 8, 0.4, _linear_curve(10), seed=0),
        SweepRun("c1", 8, 0.4, LossCurve([0, 50], [2.0, 1.5]), seed=1),
    ]
    (point,) = best_per_batch(runs, 1.0)
    assert point.lr == 0.1
    assert point.steps == pytest.approx(110.0)
    assert point.examples == pytest.approx(880.0)
    assert point.run_ids == ("a0", "a1")


def test_critical_batch_rows_recover_the_model_and_the_noise_scale() -> None:
    s_min, b_crit = 50.0, 64.0
    g_sq, trace_sigma = 2.0, 2.0 * 40.0  # B_simple = 40
    runs = []
    for b in (4, 8, 16, 32, 64, 128, 256):
        s = s_min * (1 + b_crit / b)
        samples = _samples(int(3 * s), g_sq, trace_sigma, b / 4, b)
        runs.append(SweepRun(f"B{b}", b, 0.1, _linear_curve(s), samples))
        # A slower learning rate at the same batch size is ignored.
        runs.append(SweepRun(f"B{b}-slow", b, 0.01, _linear_curve(3 * s), samples))
    (row,) = critical_batch_rows(runs, [1.0])
    assert row.fit is not None
    assert row.fit.b_crit == pytest.approx(b_crit, rel=1e-3)
    assert row.fit.s_min == pytest.approx(s_min, rel=1e-3)
    assert row.b_simple == pytest.approx(40.0)
    assert row.ratio == pytest.approx(40.0 / b_crit, rel=1e-3)
    assert len(row.points) == 7
    assert all(p.lr == 0.1 for p in row.points)


def test_rows_say_why_a_target_cannot_be_fitted() -> None:
    runs = [SweepRun(f"B{b}", b, 0.1, _linear_curve(100)) for b in (4, 8)]
    (row,) = critical_batch_rows(runs, [1.0])
    assert row.fit is None
    assert row.fit_error is not None
    assert "3 distinct batch sizes" in row.fit_error
    assert row.ratio is None


def test_window_takes_the_ratio_of_sums_not_the_mean_of_ratios() -> None:
    # Two steps: B_simple 1 and 100 with very different |G|^2; ratio of sums != mean of ratios.
    samples = NoiseSamples(
        step=[1.0, 2.0],
        b_small=[1.0, 1.0],
        b_big=[2.0, 2.0],
        g_small_sq=[10.0 + 10.0, 0.1 + 10.0],
        g_big_sq=[10.0 + 5.0, 0.1 + 5.0],
    )
    scale = window_noise_scale(samples, 0, 10)
    assert scale.b_simple == pytest.approx(20.0 / 10.1)
    assert window_noise_scale(samples, 2, 2).b_simple == pytest.approx(100.0)


def test_b_simple_at_loss_uses_the_window_around_the_crossing() -> None:
    # B_simple is 10 before step 80 and 1000 after: the crossing at 100 sees only the later.
    steps = [float(s) for s in range(1, 301)]
    samples = NoiseSamples(
        step=steps,
        b_small=[1.0] * 300,
        b_big=[4.0] * 300,
        g_small_sq=[1.0 + (10.0 if s < 80 else 1000.0) for s in steps],
        g_big_sq=[1.0 + (10.0 if s < 80 else 1000.0) / 4 for s in steps],
    )
    run = SweepRun("r", 4, 0.1, _linear_curve(100), samples)
    scale = b_simple_at_loss(run, 1.0)
    assert scale is not None
    assert scale.b_simple == pytest.approx(1000.0)
    assert b_simple_at_loss(run, -5.0) is None


def test_noise_scale_curve_matches_the_window_estimate() -> None:
    samples = _samples(200, 1.0, 25.0, 2, 8)
    run = SweepRun("r", 8, 0.1, _linear_curve(100), samples)
    curve = noise_scale_curve(run)
    assert curve
    assert all(b == pytest.approx(25.0) for _, _, b in curve if b is not None)
    step, _, b = curve[10]
    assert b == pytest.approx(window_noise_scale(samples, step / 1.25, step * 1.25).b_simple)
