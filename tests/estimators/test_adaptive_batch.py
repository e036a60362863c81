"""The adaptive-batch formulas against docs/science.md's S–E model, integrated in closed form."""

from __future__ import annotations

import math

import pytest

from noisescope.estimators import adaptive_batch_target, noise_scaled_lr

# A run in pieces of equal minimal steps dS_min, with B_noise growing 100x as the loss falls.
B_NOISE: list[float] = [10.0 * 100.0 ** (i / 49) for i in range(50)]
S_MIN = float(len(B_NOISE))
E_MIN = sum(B_NOISE)


def _cost(batch_of: list[float]) -> tuple[float, float]:
    """S = Σ dS_min (1 + B_noise/B), E = Σ dS_min (B + B_noise): steps and examples."""
    steps = sum(1.0 + bn / b for bn, b in zip(B_NOISE, batch_of, strict=True))
    examples = sum(b + bn for bn, b in zip(B_NOISE, batch_of, strict=True))
    return steps, examples


def _product(steps: float, examples: float) -> float:
    return (steps / S_MIN - 1.0) * (examples / E_MIN - 1.0)


@pytest.mark.parametrize("batch", [1.0, 30.0, 300.0, 3000.0])
def test_every_fixed_batch_lies_on_the_hyperbola(batch: float) -> None:
    assert _product(*_cost([batch] * len(B_NOISE))) == pytest.approx(1.0)


@pytest.mark.parametrize("ratio", [0.5, 1.0, 2.0])
def test_following_b_noise_in_proportion_lies_on_it_too(ratio: float) -> None:
    assert _product(*_cost([ratio * bn for bn in B_NOISE])) == pytest.approx(1.0)


@pytest.mark.parametrize("b_ref", [10.0, 100.0, 1000.0])
def test_the_sqrt_schedule_lies_inside_by_the_cauchy_schwarz_gap(b_ref: float) -> None:
    schedule = [adaptive_batch_target(bn, b_ref) for bn in B_NOISE]
    steps, examples = _cost(schedule)
    gap = sum(math.sqrt(bn) for bn in B_NOISE) ** 2 / (S_MIN * E_MIN)
    assert _product(steps, examples) == pytest.approx(gap)
    assert gap < 0.8
    # and it minimises steps + examples/B_ref over every fixed batch and every κ·B_noise
    best = steps + examples / b_ref
    for batch in [b_ref * 2.0**k for k in range(-6, 7)]:
        fixed_steps, fixed_examples = _cost([batch] * len(B_NOISE))
        assert best < fixed_steps + fixed_examples / b_ref
        prop_steps, prop_examples = _cost([batch / b_ref * bn for bn in B_NOISE])
        assert best < prop_steps + prop_examples / b_ref


def test_a_constant_noise_scale_leaves_nothing_to_gain() -> None:
    steps = examples = 0.0
    for _ in range(10):
        batch = adaptive_batch_target(50.0, 200.0)
        steps, examples = steps + 1.0 + 50.0 / batch, examples + batch + 50.0
    assert (steps / 10 - 1.0) * (examples / 500 - 1.0) == pytest.approx(1.0)


def test_the_noise_learning_rate_is_half_of_max_at_b_noise_and_linear_below() -> None:
    assert noise_scaled_lr(0.8, 64.0, 64.0) == pytest.approx(0.4)
    assert noise_scaled_lr(0.8, 1.0, 1e6) == pytest.approx(0.8 / 1e6, rel=1e-5)
    assert noise_scaled_lr(0.8, 1e9, 1.0) == pytest.approx(0.8)
    assert noise_scaled_lr(0.8, 8.0, 0.0) == pytest.approx(0.8)


@pytest.mark.parametrize(
    "call",
    [
        lambda: noise_scaled_lr(0.0, 8.0, 1.0),
        lambda: noise_scaled_lr(0.8, -1.0, 1.0),
        lambda: noise_scaled_lr(0.8, 8.0, math.nan),
        lambda: adaptive_batch_target(-1.0, 8.0),
        lambda: adaptive_batch_target(1.0, 0.0),
        lambda: adaptive_batch_target(1.0, math.inf),
    ],
)
def test_bad_inputs_are_refused(call: object) -> None:
    with pytest.raises(ValueError, match="must be"):
        call()  # type: ignore[operator]
