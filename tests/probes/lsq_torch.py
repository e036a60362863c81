"""The least-squares ground-truth model (tests/estimators/lsq_truth.py) as a torch module."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from tests.estimators.lsq_truth import LeastSquares


@dataclass
class ListSink:
    """The probe's sink contract (noisescope.Run.log_sample), collecting rows in a list."""

    rows: list[dict[str, Any]] = field(default_factory=list)

    def log_sample(
        self,
        step: int,
        b_small: float,
        b_big: float,
        g_small_sq: float,
        g_big_sq: float,
        *,
        examples: float | None = None,
        series: str = "",
        loss: float | None = None,
        lr: float | None = None,
    ) -> None:
        self.rows.append(
            {
                "step": step,
                "b_small": b_small,
                "b_big": b_big,
                "g_small_sq": g_small_sq,
                "g_big_sq": g_big_sq,
                "examples": examples,
                "series": series,
                "loss": loss,
                "lr": lr,
            }
        )

    def series(self, name: str = "") -> list[dict[str, Any]]:
        return [r for r in self.rows if r["series"] == name]


def lsq_model(problem: LeastSquares, w: np.ndarray) -> nn.Linear:
    model = nn.Linear(problem.d, 1, bias=False).double()
    with torch.no_grad():
        model.weight.copy_(torch.from_numpy(w)[None, :])
    return model


class Sampler:
    """Fresh Gaussian batches from the problem, as double tensors."""

    def __init__(self, problem: LeastSquares, seed: int) -> None:
        self.problem = problem
        self.rng = np.random.default_rng(seed)

    def __call__(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.problem.sample(self.rng, (n,))
        return torch.from_numpy(x), torch.from_numpy(y)


def mean_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return 0.5 * (model(x).squeeze(-1) - y).square().mean()
