"""The normalisation maths (``noisescope.torch._normalise``) against closed forms."""

from __future__ import annotations

import numpy as np
import pytest

from noisescope.torch import _normalise as nz


@pytest.mark.parametrize(
    ("micro_loss", "expected"),
    [
        ("mean/k", [1 / 3, 1 / 3, 1 / 3]),
        ("mean", [1.0, 1.0, 1.0]),
        ("sum/N", [8 / 32, 8 / 32, 16 / 32]),
        ("sum", [8.0, 8.0, 16.0]),
    ],
)
def test_grad_scales_follow_the_loss_reduction(micro_loss: str, expected: list[float]) -> None:
    assert nz.grad_scales(micro_loss, [8, 8, 16], [None] * 3) == pytest.approx(expected)  # type: ignore[arg-type]


def test_an_explicit_grad_scale_overrides_the_convention() -> None:
    assert nz.grad_scales("mean/k", [8, 8], [None, 0.25]) == [0.5, 0.25]


def test_b_small_is_the_harmonic_mean_of_the_micro_batches() -> None:
    sizes = [24, 32, 40, 32]
    expected = 4 / sum(1 / b for b in sizes)
    assert nz.b_small(len(sizes), sum(1 / b for b in sizes)) == pytest.approx(expected)


def test_b_big_is_the_item_count_when_c_is_proportional_to_b() -> None:
    sizes = [24, 32, 40, 32]
    c = nz.grad_scales("sum/N", sizes, [None] * 4)
    assert nz.b_big(sum(c), sum(cj * cj / b for cj, b in zip(c, sizes, strict=True))) == 128


def test_b_big_of_equal_weights_on_unequal_micro_batches() -> None:
    """mean/k on micro-batches of 1 and 3: Var = Sigma (1/4)(1/1 + 1/3) / 1, so B_big = 3."""
    c = nz.grad_scales("mean/k", [1, 3], [None, None])
    assert nz.b_big(sum(c), c[0] ** 2 / 1 + c[1] ** 2 / 3) == pytest.approx(3.0)


def test_b_big_matches_the_variance_of_the_weighted_gradient() -> None:
    """Monte-Carlo of sum_j c_j g_j / sum_j c_j with g_j the mean of b_j unit-variance draws:
    its variance is 1 / B_big."""
    rng = np.random.default_rng(0)
    sizes, c = [2, 5, 9], [0.7, 0.2, 1.3]
    draws = sum(cj * rng.normal(size=(200_000, b)).mean(1) for cj, b in zip(c, sizes, strict=True))
    variance = float(np.var(draws / sum(c)))
    b_big = nz.b_big(sum(c), sum(cj * cj / b for cj, b in zip(c, sizes, strict=True)))
    assert variance == pytest.approx(1 / b_big, rel=0.02)


def test_g_big_divisor_averages_over_ranks() -> None:
    """W ranks each add c g (sum c over ranks = W c); DDP/FSDP average: .grad = c g."""
    assert nz.g_big_divisor(sum_c=4 * 0.5, world_size=4) == pytest.approx(0.25)


def test_per_example_factors_recover_the_example_gradient() -> None:
    """A mean loss over n examples scaled by c: example i adds c g_i / n."""
    rng = np.random.default_rng(1)
    g = rng.normal(size=5)
    c, n, b = 0.5, 8, 8.0
    gamma = c * g / n
    assert float(gamma @ gamma) * nz.per_example_factor(c, n) == pytest.approx(float(g @ g))
    # tokens: example i with n_i of the batch's b tokens adds c n_i g_i / b
    n_i = 3.0
    gamma = c * n_i * g / b
    factor = nz.per_example_token_factor(c, b) / n_i**2
    assert float(gamma @ gamma) * factor == pytest.approx(float(g @ g))
