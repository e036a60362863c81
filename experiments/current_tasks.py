"""The exact-truth study's tasks (``experiments.current_truth``): a finite training set, a
model and its per-example loss, and |G|² and tr(Σ) exactly at the current parameters."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.nn import functional as F

from experiments.tasks import TinyGPT, stdlib_text

__all__ = ["TASKS", "TRUTH_EVERY", "TRUTH_EVERY_RECENT", "TRUTH_RECENT", "Task", "make_optimizer"]

#: Steps between exact evaluations (per-example gradients over the whole training set) over
#: a run's first ``1 - TRUTH_RECENT`` of its planned steps, and over the rest, where every
#: window the rule can name lies (it reaches back at most half the run): a window of 64 steps
#: then holds 16 exact points, so "the exact value over the window" is itself exact enough to
#: judge a 90% interval by.
TRUTH_EVERY = 10
TRUTH_EVERY_RECENT = 4
TRUTH_RECENT = 0.6


# --- the tasks: a finite training set, a model, the per-example loss ------------------------


class Task:
    """A finite training set (``n`` examples) and a model with a per-example loss."""

    model: nn.Module
    n: int
    #: Steps between exact evaluations, before and over the last ``TRUTH_RECENT`` of a run.
    truth_every = TRUTH_EVERY
    truth_every_recent = TRUTH_EVERY_RECENT

    def __init__(self, seed: int) -> None:
        raise NotImplementedError

    def loss(self, idx: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    x: torch.Tensor
    y: torch.Tensor

    def example_loss(
        self, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor:  # one example, for vmap
        raise NotImplementedError

    def full_loss(self) -> float:
        with torch.no_grad():
            return float(self.loss(torch.arange(self.n)))

    def truth(self) -> tuple[float, float]:
        """Exact |G|² and tr(Σ) at the current parameters over the whole training set."""
        params = {k: v.detach() for k, v in self.model.named_parameters()}
        per_example = vmap(grad(self.example_loss), in_dims=(None, 0, 0))
        sum_g = None
        sum_sq = 0.0
        for lo in range(0, self.n, 512):
            grads = per_example(params, self.x[lo : lo + 512], self.y[lo : lo + 512])
            flat = torch.cat([g.reshape(g.shape[0], -1) for g in grads.values()], dim=1)
            sum_sq += float(flat.double().pow(2).sum())
            part = flat.double().sum(0)
            sum_g = part if sum_g is None else sum_g + part
        assert sum_g is not None
        g_mean = sum_g / self.n
        g_sq = float(g_mean.pow(2).sum())
        return g_sq, sum_sq / self.n - g_sq


class _Digits(Task):
    """64-32-10 tanh MLP on the 1,437 training images of scikit-learn's bundled digits."""

    def __init__(self, seed: int) -> None:
        from sklearn.datasets import load_digits

        data = load_digits()
        order = np.random.default_rng(0).permutation(len(data.target))
        idx = order[: int(0.8 * len(order))]
        self.x = torch.tensor(data.data[idx] / 16.0, dtype=torch.float32)
        self.y = torch.tensor(data.target[idx], dtype=torch.long)
        self.n = len(self.y)
        torch.manual_seed(seed)
        self.model = nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 10))

    def loss(self, idx: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.model(self.x[idx]), self.y[idx])

    #: The closed form below is ~10x faster than ``torch.func``: every step gets its truth.
    truth_every = truth_every_recent = 1

    def truth(self) -> tuple[float, float]:
        """Exact |G|² and tr(Σ) from the per-example gradients in closed form (float64): for
        z = W2·tanh(W1·x + b1) + b2 and cross-entropy, example i's gradient is δ2 = softmax(z) −
        onehot(y) for b2 and δ2·hᵀ for W2, δ1 = (W2ᵀδ2) ⊙ (1 − h²) for b1 and δ1·xᵀ for W1, so
        |g_i|² = |δ2|²(|h|² + 1) + |δ1|²(|x|² + 1)."""
        first, _, second = self.model.children()
        assert isinstance(first, nn.Linear) and isinstance(second, nn.Linear)
        with torch.no_grad():
            x = self.x.double()
            w1, b1 = first.weight.double(), first.bias.double()
            w2, b2 = second.weight.double(), second.bias.double()
            h = torch.tanh(x @ w1.T + b1)
            delta2 = torch.softmax(h @ w2.T + b2, dim=1)
            delta2[torch.arange(self.n), self.y] -= 1.0
            delta1 = (delta2 @ w2) * (1.0 - h * h)
            sq = delta2.pow(2).sum(1) * (h.pow(2).sum(1) + 1.0) + delta1.pow(2).sum(1) * (
                x.pow(2).sum(1) + 1.0
            )
            n = float(self.n)
            g_sq = float(
                (delta2.T @ h / n).pow(2).sum()
                + (delta2.mean(0)).pow(2).sum()
                + (delta1.T @ x / n).pow(2).sum()
                + (delta1.mean(0)).pow(2).sum()
            )
            return g_sq, float(sq.mean()) - g_sq

    def example_loss(
        self, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor:
        return F.cross_entropy(functional_call(self.model, params, (x[None],)), y[None])


class _ByteLM(Task):
    """A 1-layer byte-level transformer on 256 fixed 32-byte windows of the stdlib's source."""

    CONTEXT = 32

    def __init__(self, seed: int) -> None:
        train, _ = stdlib_text()
        data = torch.tensor(list(train), dtype=torch.long)
        starts = torch.linspace(0, len(data) - self.CONTEXT - 2, 256).long()
        offsets = torch.arange(self.CONTEXT)
        self.x = data[starts[:, None] + offsets]
        self.y = data[starts[:, None] + offsets + 1]
        self.n = len(self.x)
        torch.manual_seed(seed)
        self.model = TinyGPT(self.CONTEXT, d=32, heads=2, layers=1)

    def loss(self, idx: torch.Tensor) -> torch.Tensor:
        logits = self.model(self.x[idx])
        return F.cross_entropy(logits.reshape(-1, 256), self.y[idx].reshape(-1))

    def example_loss(
        self, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor:
        logits = functional_call(self.model, params, (x[None],))
        return F.cross_entropy(logits.reshape(-1, 256), y.reshape(-1))


TASKS: dict[str, type[Task]] = {"digits": _Digits, "bytelm": _ByteLM}


def make_optimizer(name: str, params: Sequence[torch.Tensor], lr: float) -> torch.optim.Optimizer:
    if name == "sgdm":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    return torch.optim.Adam(params, lr=lr)
