"""Per-example gradients in factored form: their squared norms and their inner products.

A layer applied at T positions of example i has the per-example gradient (docs/science.md,
"Per-example gradient norms where real models share or broadcast parameters")::

    g_i = sum_t a_it b_it^T        in its parameter's (rows, cols) layout

Linear (weight out x in): a = the output gradient delta, b = the input x. Embedding (V x d):
a = one-hot(id), b = the output gradient. Conv: a linear layer over unfolded patches. Then
(Goodfellow 2015; Li et al. 2022 "ghost norm"; Gray et al. 2023/2024)::

    |g_i|^2 = sum_{t,s} (a_it . a_is)(b_it . b_is)                            (T x T Grams)

and two uses u, v of one parameter (tied embedding and head, a module called twice) have
g_i = g_i^u + g_i^v, whose squared norm needs the cross term <g_i^u, g_i^v>: the same sum over
pairs of positions of the two uses. Vector-shaped per-example gradients (biases, LayerNorm,
``torch.func``) are kept whole (``Flat``). Sums run in float32 at least (float64 stays).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


def wide(t: Tensor) -> Tensor:
    """``t`` in the precision the sums run in: half precisions widened to float32."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


@dataclass
class LowRank:
    """g_i = sum_t a_it b_it^T: ``a`` dense (B, T, P) or ``ids`` (B, T) (a = one-hot(ids))."""

    b: Tensor  # (B, T, Q)
    a: Tensor | None = None
    ids: Tensor | None = None
    #: rows Grams already taken against uses whose backward comes later: use serial -> (B, T, S)
    gathered: dict[int, Tensor] = field(default_factory=dict)


@dataclass
class Flat:
    """The per-example gradients themselves, flattened: (B, numel)."""

    g: Tensor


Factor = LowRank | Flat


def lowrank_sq(a: Tensor, b: Tensor) -> Tensor:
    """Per-example |sum_t a_t b_t^T|_F^2; a: (B, T, P), b: (B, T, Q): the cheaper of the Gram
    form, O(B T^2 (P + Q)), and the product formed per example, O(B T P Q)."""
    t, p, q = a.shape[1], a.shape[2], b.shape[2]
    if t == 1:
        return a.square().sum((1, 2)) * b.square().sum((1, 2))
    if t * (p + q) <= p * q:
        gram_a = torch.bmm(a, a.transpose(1, 2))
        gram_b = torch.bmm(b, b.transpose(1, 2))
        return (gram_a * gram_b).sum((1, 2))
    return torch.bmm(a.transpose(1, 2), b).square().sum((1, 2))


def embedding_sq(ids: Tensor, delta: Tensor, n_rows: int) -> Tensor:
    """Per-example |grad W|^2 of an Embedding; ids: (B, T), delta: (B, T, D).

    Row v of example b's gradient is the sum of delta_bt over the t with id v: sum the deltas
    of each distinct (example, id) pair (one segment sum over B T keys), then add up the
    squared norms of those rows per example. O(B T D) time and memory, like delta itself,
    whatever the vocabulary and sequence length (the "equal id" Gram identity is O(B T^2 D)).
    Segments come from a sort, not ``torch.unique``, whose data-dependent size would make a
    GPU wait for the host in the middle of the backward pass.
    """
    b, t, d = delta.shape
    if t == 1:
        return delta.square().sum((1, 2))
    keys = (ids + n_rows * torch.arange(b, device=ids.device).unsqueeze(1)).reshape(-1)
    sorted_keys, order = keys.sort()
    starts = torch.ones_like(sorted_keys, dtype=torch.bool)
    starts[1:] = sorted_keys[1:] != sorted_keys[:-1]
    segment = starts.cumsum(0) - 1  # segment of each sorted position; at most B T segments
    row = torch.empty_like(segment).scatter_(0, order, segment)  # of each original position
    rows = delta.new_zeros(keys.numel(), d).index_add_(0, row, delta.reshape(-1, d))
    # each segment's example (unused segments keep 0 and add a zero norm)
    example = torch.zeros_like(segment).scatter_(
        0, segment, torch.div(sorted_keys, n_rows, rounding_mode="floor")
    )
    return delta.new_zeros(b).index_add_(0, example, rows.square().sum(1))


def sq_norm(f: Factor, n_rows: int) -> Tensor:
    """Per-example squared norm of one use's gradient, shape (B,)."""
    if isinstance(f, Flat):
        return f.g.square().sum(1)
    if f.ids is not None:
        return embedding_sq(f.ids, f.b, n_rows)
    assert f.a is not None
    return lowrank_sq(f.a, f.b)


def _gather_rows(a: Tensor, ids: Tensor) -> Tensor:
    """(B, S, T): a[i, s, ids[i, t]], the rows Gram of dense rows ``a`` and one-hot ``ids``."""
    return a.gather(2, ids.unsqueeze(1).expand(-1, a.shape[1], -1))


def gather_for(f: LowRank, ids: Tensor) -> Tensor:
    """The rows Gram (B, T_f, T) of ``f`` against a later use's one-hot rows: taken now, so that
    ``f``'s dense rows (a head's (B, T, V) output gradient) need not be kept."""
    if f.ids is not None:
        return (f.ids.unsqueeze(2) == ids.unsqueeze(1)).to(f.b.dtype)
    assert f.a is not None
    return _gather_rows(f.a, ids)


def _rows_gram(f: LowRank, h: LowRank, h_serial: int) -> Tensor:
    """(B, T_f, T_h): a^f_t . a^h_s."""
    if h_serial in f.gathered:
        return f.gathered[h_serial]
    if h.ids is not None:
        return gather_for(f, h.ids)
    if f.ids is not None:
        return gather_for(h, f.ids).transpose(1, 2)
    assert f.a is not None and h.a is not None
    return torch.bmm(f.a, h.a.transpose(1, 2))


def _dense(f: Factor, n_rows: int) -> Tensor:
    """The per-example gradients (B, rows x cols) of a factor (only for a rare mixed pair)."""
    if isinstance(f, Flat):
        return f.g
    batch, _, q = f.b.shape
    if f.ids is not None:
        out = f.b.new_zeros(batch, n_rows, q)
        out.scatter_add_(1, f.ids.unsqueeze(2).expand(-1, -1, q), f.b)
        return out.reshape(batch, -1)
    assert f.a is not None
    return torch.bmm(f.a.transpose(1, 2), f.b).reshape(batch, -1)


def inner(f: Factor, h: Factor, h_serial: int, n_rows: int) -> Tensor:
    """Per-example <g^f_i, g^h_i>, shape (B,); ``h`` is the use numbered ``h_serial``."""
    if isinstance(f, LowRank) and isinstance(h, LowRank):
        cols = torch.bmm(f.b, h.b.transpose(1, 2))
        return (_rows_gram(f, h, h_serial) * cols).sum((1, 2))
    return (_dense(f, n_rows) * _dense(h, n_rows)).sum(1)
