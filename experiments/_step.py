"""One measured optimizer step, shared by every task: the noise-scale sample and the update.

Each step splits its batch into ``k`` equal micro-batches (gradient accumulation): the
micro-batch gradients are the ``G_small`` and their mean is ``G_big`` (docs/science.md, "Where
the two batch sizes come from"), so the noise-scale samples cost no extra backward passes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

__all__ = ["StepResult", "measured_step", "micro_count"]


@dataclass(frozen=True)
class StepResult:
    """One optimizer step's noise-scale sample (docs/science.md eq. 1) and its training loss."""

    b_small: float
    b_big: float
    g_small_sq: float
    g_big_sq: float
    loss: float


# --------------------------------------------------------------------------------------------
# Generic torch step: k micro-batches, their gradients are G_small, the mean is G_big.


def measured_step(
    params: Sequence[torch.Tensor],
    optimizer: torch.optim.Optimizer,
    lr: float,
    micro_losses: Sequence[Callable[[], torch.Tensor]],
    b_small: float,
) -> StepResult:
    """Gradient accumulation with per-micro-batch squared norms, then one optimizer step."""
    k = len(micro_losses)
    total: list[torch.Tensor] = [torch.zeros_like(p) for p in params]
    g_small_sq = 0.0
    loss_sum = 0.0
    for loss_fn in micro_losses:
        loss = loss_fn()
        grads = torch.autograd.grad(loss, list(params))
        g_small_sq += float(sum(g.pow(2).sum() for g in grads))
        for acc, g in zip(total, grads, strict=True):
            acc.add_(g)
        loss_sum += float(loss.detach())
    g_big_sq = 0.0
    for p, acc in zip(params, total, strict=True):
        acc.div_(k)
        g_big_sq += float(acc.pow(2).sum())
        p.grad = acc
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.step()
    return StepResult(
        b_small=b_small,
        b_big=b_small * k,
        g_small_sq=g_small_sq / k,
        g_big_sq=g_big_sq,
        loss=loss_sum / k,
    )


def micro_count(batch_size: int, k: int) -> int:
    k = min(k, batch_size)
    if batch_size % k:
        raise ValueError(f"batch size {batch_size} is not divisible into {k} micro-batches")
    return k
