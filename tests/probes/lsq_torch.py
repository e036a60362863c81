"""The least-squares ground-truth model (tests/estimators/lsq_truth.py) as a torch module."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from noisescope._sink import Sink
from tests.estimators.lsq_truth import LeastSquares

_LOG_SAMPLE = inspect.signature(Sink.log_sample)


@dataclass
class ListSink:
    """The probe's sink contract (noisescope.Run.log_sample), collecting rows in a list.

    Arguments are bound against ``Sink.log_sample`` itself, so a row has exactly the protocol's
    fields (its defaults filled in) and a call the protocol would refuse raises ``TypeError``.
    """

    rows: list[dict[str, Any]] = field(default_factory=list)

    def log_sample(self, *args: Any, **kwargs: Any) -> None:
        bound = _LOG_SAMPLE.bind(self, *args, **kwargs)
        bound.apply_defaults()
        self.rows.append({k: v for k, v in bound.arguments.items() if k != "self"})

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
    loss: torch.Tensor = 0.5 * (model(x).squeeze(-1) - y).square().mean()
    return loss


def finished(probe: Any, sink: ListSink) -> dict[str, Any]:
    """Remove ``probe``; what a worker process reports of it (JSON): the rows and how the
    probe saw the model."""
    probe.remove()
    return {
        "rows": sink.rows,
        "kind": probe.layout.kind,
        "source": probe.source,
        "world": probe.world_size,
        "error": probe.error,
    }
