"""A measured step's sums, packed on the device without a host read, and unpacked on the host.

Layout of the packed vector in ``_readout``. Micro source: row j of the norms (backward j)
is weighted by 1/c_j^2 (``_normalise``: an incoming gradient c_j g_j has |g_j|^2 =
|incoming|^2 / c_j^2); the row after them is the optimizer's gradient. Per-example source: each
example's squared norm rescaled by ``_normalise.per_example_factor``. A loss scale (fp16 AMP),
kept on the device, is divided out of both squared norms.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from . import _normalise, _torch_api
from ._normalise import MicroLoss
from ._readout import N_COUNTS, N_FLAGS, Readout
from ._rows import NormRows


@dataclass(frozen=True)
class ProbeSample:
    """What one measured step produced for the whole model (series "")."""

    step: int
    b_small: float
    b_big: float
    g_small_sq: float
    g_big_sq: float
    examples: float


@dataclass
class Micro:
    """One backward of the step, as ``micro_step`` recorded it."""

    row: int | None  # micro source: this backward's row of norms; None: not a G_small
    per_example: Tensor | None  # per-example source: (n_slots, B) squared norms
    batch_size: float
    grad_scale: float | None
    item_counts: Tensor | None
    n_full: int = 0  # per-example source: examples in the micro-batch (measured or not)


Counts = tuple[float, float, float, float, float, float, float]
"""G_small samples, sum 1/b, sum c, sum c^2/b, items, ranks stopped, ranks misused."""


class StepSums:
    def __init__(
        self,
        rows: NormRows,
        readout: Readout,
        slot_matrix: Tensor,
        micro_loss: MicroLoss,
        scaler: Any,
        sharded: bool,
        reduced_sq: Callable[[torch.device], Tensor] | None = None,
    ) -> None:
        self.rows, self.readout, self.slot_matrix = rows, readout, slot_matrix
        self.micro_loss, self.scaler, self.sharded = micro_loss, scaler, sharded
        #: where |G_big|^2 comes from when not ``.grad`` (DeepSpeed: the engine's norm)
        self.reduced_sq = reduced_sq
        self.n_slots = slot_matrix.shape[1]
        self.device = rows.device

    def pack(
        self, micros: list[Micro], misused: bool, loss_scale: float = 1.0
    ) -> tuple[Tensor, int]:
        """This rank's sums on the device, in ``_readout``'s layout, and how many of them lead
        that are summed over ranks. ``loss_scale``: a factor on the backwards' gradients only
        (DeepSpeed fp16: its norm is unscaled)."""
        scales = _normalise.grad_scales(
            self.micro_loss, [m.batch_size for m in micros], [m.grad_scale for m in micros]
        )
        n_rows = self.rows.n_rows
        weights = [0.0] * n_rows  # 1 / c_j^2 on each G_small row
        small_count = small_inv_b = 0.0
        per_example: Tensor | None = None  # per-slot sums, on the device
        inv_b_device: Tensor | None = None
        for m, c in zip(micros, scales, strict=True):
            if m.per_example is None:
                if m.row is None:
                    continue  # small_batches="first": only the first backward is a G_small
                weights[m.row] = 1.0 / (c * c)
                small_count += 1.0
                small_inv_b += 1.0 / m.batch_size
                continue
            n_ex = m.per_example.shape[1]  # measured examples (<= n_full)
            if m.item_counts is None:
                sq_sum = m.per_example.sum(1) * _normalise.per_example_factor(c, m.n_full)
                small_inv_b += n_ex * m.n_full / m.batch_size
            else:
                counts = m.item_counts
                scale = _normalise.per_example_token_factor(c, m.batch_size) / counts.square()
                sq_sum = (m.per_example * scale).sum(1)
                inv_b = (1.0 / counts).sum().double()
                inv_b_device = inv_b if inv_b_device is None else inv_b_device + inv_b
            per_example = sq_sum if per_example is None else per_example + sq_sum
            small_count += float(n_ex)
        if self.reduced_sq is None:  # the optimizer's gradient: after the backwards' rows
            self.rows.read_grad_into(n_rows)
        sum_c = sum(scales)
        sum_c2_over_b = sum(c * c / m.batch_size for m, c in zip(micros, scales, strict=True))
        n_items = sum(m.batch_size for m in micros)
        totals = [small_count, small_inv_b, sum_c, sum_c2_over_b, n_items, 0.0, float(misused)]
        host = self.readout.to_device([*weights, *totals])
        squares = self.rows.squares(self.slot_matrix, n_rows).double()
        small = host[:n_rows] @ squares[:n_rows]
        if per_example is not None:
            small = small + per_example.double()
        big = squares[n_rows] if self.reduced_sq is None else self.reduced_sq(self.device)
        if loss_scale != 1.0:
            small = small / (loss_scale * loss_scale)
        if self.scaler is not None and self.scaler.is_enabled():
            inv_sq = _torch_api.loss_scale(self.scaler, self.device).reciprocal().square()
            small, big = small * inv_sq, big * inv_sq
        tail = host[n_rows:]
        if inv_b_device is not None:  # tokens: sum 1/n_i of the examples, on the device
            tail = torch.cat([tail[:1], tail[1:2] + inv_b_device.view(1), tail[2:]])
        if self.sharded:  # FSDP: the shards' squares add over ranks
            packed = torch.cat([small, big, tail])
            return packed, len(packed)
        return torch.cat([small, tail, big]), len(small) + len(tail)

    def stopped(self) -> Tensor:
        """What a rank that stopped after an error sends in place of its sums: the flag."""
        n = self.n_slots * (2 if self.sharded else 1) + N_COUNTS
        flags = torch.zeros(n + N_FLAGS, dtype=torch.float64, device=self.device)
        flags[n] = 1.0
        return flags

    def unpack(self, values: list[float]) -> tuple[list[float], list[float], Counts]:
        """Per-slot G_small sums, per-slot |.grad|^2, and the counts and flags."""
        s = self.n_slots
        small_l = values[:s]
        if self.sharded:
            big_l, rest = values[s : 2 * s], values[2 * s :]
        else:
            rest, big_l = values[s : s + N_COUNTS + N_FLAGS], values[s + N_COUNTS + N_FLAGS :]
        count, inv_b, c_tot, c2b_tot, items, stopped, misused = rest
        return small_l, big_l, (count, inv_b, c_tot, c2b_tot, items, stopped, misused)
