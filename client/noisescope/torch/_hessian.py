"""Hessian-aware B_noise = tr(H Sigma) / (G^T H G) for models small enough for extra passes.

docs/science.md: B_noise is the noise scale that sets the optimal step and the loss improvement per
step; it equals B_simple only when H is proportional to I. The quadratic-form analogue of eq. 1,

    E[G_B^T H G_B] = G^T H G + tr(H Sigma) / B,

holds for any fixed H, and stays true with an unbiased Hessian estimate H^ taken on a batch
independent of G_B (E[G_B^T H^ G_B] = E[G_B^T H G_B]). So we measure the quadratic forms
G_small^T H^ G_small and G_big^T H^ G_big with two Hessian-vector products (double backward) and
feed them to the same two-batch estimator as the squared norms (App. A.1), sums first, ratio
last. Costs per sample: three backward passes plus two HVPs; meant for offline checks of small
models, not for every training step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..estimators import NoiseScaleInterval, interval_from_steps, two_batch_estimates


@dataclass(frozen=True)
class BNoiseEstimate:
    """B_noise and, from the same batches, B_simple, each with a confidence interval.

    In ``b_noise`` the ``g_sq`` field holds G^T H G and ``trace_sigma`` holds tr(H Sigma).
    """

    b_noise: NoiseScaleInterval
    b_simple: NoiseScaleInterval
    n_samples: int


def _dot(a: list[Tensor], b: list[Tensor] | tuple[Tensor, ...]) -> float:
    return float(sum((x.double() * y.double()).sum() for x, y in zip(a, b, strict=True)))


def hessian_noise_scale(
    model: nn.Module,
    loss_fn: Callable[[nn.Module, Any], Tensor],
    sample_batch: Callable[[int], Any],
    *,
    b_small: int,
    b_big: int,
    n_samples: int = 200,
    hessian_batch_size: int | None = None,
    level: float = 0.9,
    n_blocks: int = 20,
) -> BNoiseEstimate:
    """Estimate B_noise (and B_simple) at the model's current parameters.

    Args:
        loss_fn: ``loss_fn(model, batch)`` -> the batch's *mean* loss (a scalar tensor).
        sample_batch: ``sample_batch(n)`` -> a fresh random batch of ``n`` examples.
        b_small, b_big: the two batch sizes (b_small < b_big); the big batch contains the small.
        n_samples: independent repetitions; their estimates are averaged (sums, ratio last).
        hessian_batch_size: batch for the Hessian estimate (default ``b_big``).
    """
    if not 0 < b_small < b_big:
        raise ValueError(f"need 0 < b_small < b_big, got {b_small}, {b_big}")
    if n_samples < 2:
        raise ValueError("n_samples must be at least 2")
    h_size = hessian_batch_size or b_big
    params = [p for p in model.parameters() if p.requires_grad]
    gh_g: list[float] = []
    trace_h_sigma: list[float] = []
    g_sq: list[float] = []
    trace_sigma: list[float] = []
    for _ in range(n_samples):
        g_s = list(torch.autograd.grad(loss_fn(model, sample_batch(b_small)), params))
        g_r = torch.autograd.grad(loss_fn(model, sample_batch(b_big - b_small)), params)
        w = b_small / b_big
        g_b = [w * a + (1.0 - w) * r for a, r in zip(g_s, g_r, strict=True)]
        grad_h = torch.autograd.grad(
            loss_fn(model, sample_batch(h_size)), params, create_graph=True
        )
        hv_s = torch.autograd.grad(grad_h, params, grad_outputs=g_s, retain_graph=True)
        hv_b = torch.autograd.grad(grad_h, params, grad_outputs=g_b)
        q = two_batch_estimates(b_small, b_big, _dot(g_s, hv_s), _dot(g_b, hv_b))
        gh_g.append(q[0])
        trace_h_sigma.append(q[1])
        n = two_batch_estimates(b_small, b_big, _dot(g_s, g_s), _dot(g_b, g_b))
        g_sq.append(n[0])
        trace_sigma.append(n[1])
    blocks = min(n_blocks, n_samples)
    return BNoiseEstimate(
        b_noise=interval_from_steps(gh_g, trace_h_sigma, level, blocks),
        b_simple=interval_from_steps(g_sq, trace_sigma, level, blocks),
        n_samples=n_samples,
    )
