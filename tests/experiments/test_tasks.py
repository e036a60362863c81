"""The tasks' measured steps: two-batch samples that match closed forms and direct gradients."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from experiments.tasks import TASKS, CharLM, DigitsMLP, LeastSquares, stdlib_text
from noisescope.estimators import NoiseScale, two_batch_estimates


def test_least_squares_samples_estimate_the_closed_form_noise_scale() -> None:
    """At fixed parameters (lr = 0) the window ratio of sums converges to tr(Σ)/|G|²."""
    task = LeastSquares(seed=0, sampler_seed=1, d=16, sigma=1.0, kappa=10.0, k=4)
    sum_g_sq = sum_trace_sigma = 0.0
    n = 4000
    for _ in range(n):
        res = task.step(32, lr=0.0)
        g_sq, trace_sigma = two_batch_estimates(
            res.b_small, res.b_big, res.g_small_sq, res.g_big_sq
        )
        sum_g_sq += g_sq
        sum_trace_sigma += trace_sigma
    measured = NoiseScale.from_sums(sum_g_sq, sum_trace_sigma, n).b_simple
    truth = task.truth()["b_simple_true"]
    assert measured is not None
    assert measured == pytest.approx(truth, rel=0.1)


def test_least_squares_loss_is_the_closed_form_and_falls_under_sgd() -> None:
    task = LeastSquares(seed=0, sampler_seed=1, d=8, sigma=0.5, kappa=10.0, k=2)
    start = task.eval_loss()
    assert start > 0.5 * 0.5**2
    for _ in range(300):
        task.step(16, lr=0.5)
    assert task.eval_loss() < start / 2


def test_digits_big_gradient_is_the_full_batch_gradient() -> None:
    """Mean of equal micro-batch gradients == gradient of the mean loss over the whole batch."""
    task = DigitsMLP(seed=0, sampler_seed=3, hidden=16, k=4)
    state = task.gen.get_state()
    res = task.step(32, lr=0.0)
    idx = torch.randint(0, len(task.y), (32,), generator=torch.Generator().set_state(state))
    loss = F.cross_entropy(task.model(task.x[idx]), task.y[idx])
    grads = torch.autograd.grad(loss, task.params)
    assert res.g_big_sq == pytest.approx(float(sum(g.pow(2).sum() for g in grads)), rel=1e-5)
    assert (res.b_small, res.b_big) == (8.0, 32.0)
    assert res.loss == pytest.approx(float(loss.detach()), rel=1e-5)


def test_char_lm_counts_batch_sizes_in_tokens() -> None:
    task = CharLM(
        seed=0, sampler_seed=1, context=16, d=16, heads=2, layers=1, k=2, eval_sequences=4
    )
    res = task.step(4, lr=1e-3)
    assert (res.b_small, res.b_big) == (2 * 16, 4 * 16)
    assert res.g_small_sq > 0 and res.g_big_sq > 0
    assert 0 < task.eval_loss() < 10


def test_stdlib_text_is_fixed_and_split() -> None:
    train, val = stdlib_text()
    assert len(train) > 9 * len(val) * 0.9
    assert b"def " in train and b"def " in val
    assert stdlib_text() == (train, val)


def test_batch_must_split_into_micro_batches() -> None:
    task = LeastSquares(seed=0, sampler_seed=1, d=4, sigma=1.0, kappa=2.0, k=4)
    with pytest.raises(ValueError, match="not divisible"):
        task.step(6, lr=0.1)


def test_specs_meet_the_sweep_requirements() -> None:
    for spec in TASKS.values():
        assert len(spec.batch_sizes) >= 6
        assert max(spec.batch_sizes) / min(spec.batch_sizes) >= 32
        assert len(spec.lrs) >= 3
        assert list(spec.loss_targets) == sorted(spec.loss_targets, reverse=True)
