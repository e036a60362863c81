"""From what the backwards added to ``.grad`` to the estimator's inputs (docs/science.md,
"Pitfalls": normalisation), as pure functions.

A backward adds ``c_j x`` to ``.grad``, where ``x`` is micro-batch j's mean gradient g_j and
``c_j`` follows from how the loss was reduced (``micro_loss``). We divide each G_small by
``c_j``; the optimizer's gradient is sum_j c_j g_j (averaged over ranks), which we divide by
sum_j c_j. Its covariance is Sigma * sum_j (c_j^2 / b_j) / (sum_j c_j)^2, so

    B_big = (sum_j c_j)^2 / sum_j (c_j^2 / b_j)

the total item count when c_j is proportional to b_j or the micro-batches are equal. With
unequal micro-batches the average of |g_j|^2 has E = |G|^2 + tr(Sigma) mean(1/b_j) (eq. 1), so
B_small is their harmonic mean. A loss scale (fp16 AMP) multiplies every c_j alike: it cancels
in B_big and is divided out of both squared norms.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

MicroLoss = Literal["mean/k", "mean", "sum/N", "sum"]


def grad_scales(
    micro_loss: MicroLoss, batch_sizes: Sequence[float], explicit: Sequence[float | None]
) -> list[float]:
    """Each backward's c_j: the factor between the gradient it added and its micro-batch's
    mean gradient. ``explicit[j]`` (the user's ``grad_scale=``) overrides the convention.

    "mean/k": loss.mean() / k -> 1/k; "mean": loss.mean() -> 1; "sum/N": loss.sum() / N with N
    the step's items on this rank -> b_j / N; "sum": loss.sum() -> b_j.
    """
    k = len(batch_sizes)
    n_local = sum(batch_sizes)
    out = []
    for b, c in zip(batch_sizes, explicit, strict=True):
        if c is None:
            if micro_loss == "mean/k":
                c = 1.0 / k
            elif micro_loss == "mean":
                c = 1.0
            elif micro_loss == "sum/N":
                c = b / n_local
            else:
                c = b
        out.append(c)
    return out


def b_small(n_small: float, sum_inv_b: float) -> float:
    """B_small of ``n_small`` G_small samples whose batch sizes have reciprocals summing to
    ``sum_inv_b``: their harmonic mean (E of the mean |g_j|^2 is |G|^2 + tr(Sigma) mean(1/b_j))."""
    return n_small / sum_inv_b


def b_big(sum_c: float, sum_c2_over_b: float) -> float:
    """B_big of the gradient sum_j c_j g_j: (sum c_j)^2 / sum (c_j^2 / b_j)."""
    return sum_c * sum_c / sum_c2_over_b


def g_big_divisor(sum_c: float, world_size: int) -> float:
    """What |.grad|^2 is divided by to give |G_big|^2: the gradient is (1/W) sum_r sum_j
    c_rj g_rj when W ranks average (DDP, FSDP), so its per-item mean is .grad / (sum c / W)."""
    return (sum_c / world_size) ** 2


def per_example_factor(c: float, n_examples: int) -> float:
    """Per-example source, equal item counts: example i adds gamma_i = c n_i g_i / b with
    n_i = b / n_examples, so |g_i|^2 = |gamma_i|^2 * (n_examples / c)^2."""
    return (n_examples / c) ** 2


def per_example_token_factor(c: float, batch_size: float) -> float:
    """Per-example source, example i with n_i real items (tokens): |g_i|^2 = |gamma_i|^2 *
    (b / c)^2 / n_i^2; this is the (b / c)^2 that the probe divides by n_i^2 on the device."""
    return (batch_size / c) ** 2
