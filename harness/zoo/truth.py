"""The exact noise scale of a zoo case at its fixed weights (docs/science.md, "Exact noise scale
on a real network"), and what the probe must log for a given batch.

Per example i we take the gradient s_i of its summed loss (``ZooCase.losses``) by one backward of
that example alone, and n_i its items (1, or its real tokens). Everything the probe measures is
a quadratic form of the N x N Gram matrix K = [s_i . s_j], so K is all we keep.

Truth, batches of examples drawn with replacement, the loss the mean over the batch's items:

    G = sum_i s_i / sum_i n_i,        tr(Sigma) = sum_i |s_i - n_i G|^2 / sum_i n_i

- examples (n_i = 1): G = mean g_i and tr(Sigma) = mean |g_i - G|^2, exactly; the batch
  gradient of B examples has mean G and covariance Sigma / B.
- tokens: the batch gradient sum_{i in b} s_i / sum_{i in b} n_i is a ratio; to first order in
  1/B (the delta method) its mean is G and its covariance Sigma / (B n_bar), Sigma / (items in
  the batch): tr(Sigma) above is the per-token noise of the gradient the optimizer sees. With
  equal lengths n it is n times the per-example noise of the examples' mean gradients.

B_simple = tr(Sigma) / |G|^2. ``simulate`` runs the probe's estimator on batches drawn from K
(no model), for its sampling spread and its bias at a finite number of steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from noisescope.estimators import NoiseScale, two_batch_estimates

from .cases import ZooCase


def trainable(model: nn.Module) -> list[nn.Parameter]:
    """The trainable parameters, each once (tied ones once): what the optimizer steps."""
    return [p for p in model.parameters() if p.requires_grad]


def brute_force_grads(case: ZooCase) -> Tensor:
    """(N, P) float64: row i the gradient of example i's summed loss, by its own backward."""
    params = trainable(case.model)
    return torch.stack(
        [flat_grad(case.example_losses(torch.tensor([i])).sum(), params) for i in range(case.n)]
    )


def flat_grad(loss: Tensor, params: list[nn.Parameter]) -> Tensor:
    """The gradient of ``loss`` by its own backward, flattened over ``params`` (float64; zeros
    where a parameter is unused)."""
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return torch.cat(
        [
            (g if g is not None else torch.zeros_like(p)).detach().double().reshape(-1)
            for g, p in zip(grads, params, strict=True)
        ]
    )


def func_grads(case: ZooCase) -> Tensor:
    """The same rows by ``torch.func``: ``vmap(grad)`` of a ``functional_call`` of the model."""
    model = case.model
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}

    def loss(p: dict[str, Tensor], *row: Tensor) -> Tensor:
        def call(*args: Any, **kwargs: Any) -> Any:
            return torch.func.functional_call(model, p, args, kwargs, tie_weights=True)

        return case.losses(call, tuple(r.unsqueeze(0) for r in row)).sum()

    grads = torch.func.vmap(torch.func.grad(loss), in_dims=(None, *[0] * len(case.data)))(
        params, *case.data
    )
    return torch.cat([grads[n].reshape(case.n, -1).double() for n in names], 1)


@dataclass(frozen=True)
class Truth:
    gram: np.ndarray  # (N, N): s_i . s_j
    counts: np.ndarray  # (N,): n_i

    @classmethod
    def of(cls, grads: Tensor, counts: Tensor) -> Truth:
        g = grads.double()
        return cls((g @ g.T).numpy(), counts.double().numpy())

    @property
    def g_sq(self) -> float:
        return float(self.gram.sum() / self.counts.sum() ** 2)

    @property
    def trace_sigma(self) -> float:
        k, n = self.gram, self.counts
        total = n.sum()
        # sum_i |s_i - n_i G|^2 with G = sum_j s_j / total
        resid = np.trace(k) - 2.0 * (n @ k.sum(1)) / total + (n @ n) * k.sum() / total**2
        return float(resid / total)

    @property
    def b_simple(self) -> float:
        return self.trace_sigma / self.g_sq

    # --- what the probe logs for a step ------------------------------------------------------

    def per_example_row(self, idx: Sequence[int]) -> tuple[float, float, float, float]:
        """(b_small, b_big, g_small_sq, g_big_sq) of the per-example source on the examples
        ``idx``: each example one G_small, its mean gradient s_i / n_i at B_small = n_i (the
        harmonic mean over the step), G_big the step's gradient."""
        i = np.asarray(idx)
        n = self.counts[i]
        g_small = float(np.mean(self.gram[i, i] / n**2))
        b_small = float(len(i) / np.sum(1.0 / n))
        return b_small, float(n.sum()), g_small, self._big(i)

    def micro_row(self, micro: Sequence[Sequence[int]]) -> tuple[float, float, float, float]:
        """The micro-batch source: micro-batch j's gradient sum s / its items b_j is a G_small
        (B_small the harmonic mean of the b_j); G_big = all s / all items (loss mean/k with
        equal micro-batches, or sum/N)."""
        smalls, inv_b = [], 0.0
        for m in micro:
            j = np.asarray(m)
            b = self.counts[j].sum()
            smalls.append(self.gram[np.ix_(j, j)].sum() / b**2)
            inv_b += 1.0 / b
        every = np.concatenate([np.asarray(m) for m in micro])
        b_big = float(self.counts[every].sum())
        return float(len(micro) / inv_b), b_big, float(np.mean(smalls)), self._big(every)

    def _big(self, i: np.ndarray) -> float:
        return float(self.gram[np.ix_(i, i)].sum() / self.counts[i].sum() ** 2)

    # --- the estimator on batches drawn from K -------------------------------------------------

    def simulate(
        self, steps: int, batch: int, k: int, reps: int = 200, seed: int = 0
    ) -> np.ndarray:
        """``reps`` windows of ``steps`` steps, each of ``k`` micro-batches of ``batch // k``
        examples drawn with replacement (k = 1: the per-example source); each window's B_simple
        as ``window`` takes it from the logged rows (NaN where not measurable). The rows are
        ``per_example_row`` and ``micro_row``, vectorised over count vectors c: |sum_i c_i
        s_i|^2 = c^T K c."""
        n_ex = len(self.counts)
        rng = np.random.default_rng(seed)
        draws = rng.integers(0, n_ex, size=(reps * steps, k, batch // k))
        # c[r, j, i]: how often example i is in micro-batch j of row r
        c = np.zeros((reps * steps, k, n_ex))
        np.add.at(
            c, (np.arange(reps * steps)[:, None, None], np.arange(k)[None, :, None], draws), 1
        )
        items = c @ self.counts  # (rows, k)
        total = c.sum(1)
        b_big = items.sum(1)
        g_big = np.einsum("ri,ij,rj->r", total, self.gram, total) / b_big**2
        if k == 1:
            diag = np.diag(self.gram) / self.counts**2
            g_small = (total @ diag) / total.sum(1)
            b_small = total.sum(1) / (total @ (1.0 / self.counts))
        else:
            g_small = (np.einsum("rki,ij,rkj->rk", c, self.gram, c) / items**2).mean(1)
            b_small = k / (1.0 / items).sum(1)
        out = np.empty(reps)
        for r in range(reps):
            rows = slice(r * steps, (r + 1) * steps)
            cols = (b_small[rows], b_big[rows], g_small[rows], g_big[rows])
            b_simple = window(list(zip(*(col.tolist() for col in cols), strict=True))).b_simple
            out[r] = np.nan if b_simple is None else b_simple
        return out


Rows = Sequence[Sequence[float]] | Sequence[dict[str, Any]]


def window(rows: Rows) -> NoiseScale:
    """A window of logged steps: the two-batch estimates (noisescope.estimators) summed over
    the window, their ratio taken last. Rows: (b_small, b_big, g_small_sq, g_big_sq) tuples, or
    the sink's dict rows."""
    g_sq = trace = 0.0
    for row in rows:
        if isinstance(row, dict):
            row = (row["b_small"], row["b_big"], row["g_small_sq"], row["g_big_sq"])
        g, t = two_batch_estimates(*row)
        g_sq += g
        trace += t
    return NoiseScale.from_sums(g_sq, trace, len(rows))


def window_b_simple(rows: Rows) -> float:
    """``window(rows)``'s B_simple, which must be measurable."""
    ns = window(rows)
    assert ns.b_simple is not None, ns.reason
    return ns.b_simple
