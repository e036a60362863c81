"""The small training loop the probe-mechanics tests share (test_probe_behaviour,
test_probe_reads, test_probe_failures): an MLP, its data as steps of micro-batches, a step of
accumulation with the probe, and the reference micro-batch gradients."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

import torch
from torch import Tensor, nn

from noisescope.torch import GradientNoiseProbe

if TYPE_CHECKING:
    from typing import Unpack


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 2))


def data(steps: int, k: int, b: int) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(steps, k, b, 5, generator=g), torch.randn(steps, k, b, 2, generator=g)


def loss_of(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    loss: Tensor = (model(x) - y).square().mean()
    return loss


class StepFloats(TypedDict, total=False):
    """The float keywords of ``GradientNoiseProbe.step``."""

    batch_size: float
    loss: float
    lr: float
    grad_scale: float


def train(
    model: nn.Module, probe: GradientNoiseProbe, x: Tensor, y: Tensor, **step: Unpack[StepFloats]
) -> None:
    """``x[i, j]``: micro-batch j of step i; each step accumulates loss / k, then steps the
    probe (with ``step``'s keywords)."""
    steps, k, b = x.shape[:3]
    for i in range(steps):
        for j in range(k):
            (loss_of(model, x[i, j], y[i, j]) / k).backward()
            probe.micro_step(batch_size=b)
        probe.step(**step)
        model.zero_grad()


def micro_grads(model: nn.Module, x: Tensor, y: Tensor, i: int) -> list[tuple[Tensor, ...]]:
    """Step ``i``'s micro-batch gradients, each of its own mean loss (the reference)."""
    params = list(model.parameters())
    return [
        torch.autograd.grad(loss_of(model, x[i, j], y[i, j]), params) for j in range(x.shape[1])
    ]
