"""The micro-batch source's gradient norms: one row of fp32 slots per measured backward.

Row j holds |grad| of every parameter for the step's j-th measured backward (written by the
per-parameter gradient hooks, or read from ``.grad`` after a step's first backward); the row
after them holds the accumulated gradient read at ``step()``. The slots are made once and
reused (the hooks write with ``out=``): results kept alive through the later backwards,
allocated between their large gradient buffers, fragment the heap: page faults on every step,
on the CPU several times the norms' own time. Zeroed after each measured step, so a parameter
with no gradient in a backward adds nothing, with no record of who wrote.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol, cast

import torch
from torch import Tensor, nn

from . import _torch_api
from ._wrappers import local_grad

#: Reduced in fp32: their (loss-scaled) squared norms would overflow.
_HALF = (torch.float16, torch.bfloat16)

#: Devices where every gradient norm is its own kernel, each read while the gradient is fresh:
#: a step's first backward in the hooks like the later ones, ``.grad`` at the step one
#: parameter after another. On the CPU a kernel costs no launch and the hook finds the
#: gradient in cache. Elsewhere a kernel launch per parameter costs more than a cold read:
#: ``.grad`` is read with one batched ``foreach_norm``, after the first backward too when
#: nothing will all-reduce into it (the probe's ``_before_forward``).
_PER_PARAMETER = frozenset({"cpu"})


class NormInto(Protocol):
    def __call__(self, grad: Tensor, /, *, out: Tensor) -> object: ...


def _norm_into(dtype: torch.dtype) -> NormInto:
    """Writes |grad| into an fp32 scalar slot (``out=``). A gradient has its parameter's dtype,
    so this is chosen once per parameter; for fp32, the usual case, it is the torch function
    itself (no Python frame around a call made ~100 times per backward). (A BLAS dot, faster on
    a gradient in cache, was slower here on gradients fresh from the backward.)"""
    if dtype == torch.float32:
        return cast(NormInto, torch.linalg.vector_norm)
    if dtype in _HALF:  # in fp32: a half-precision result would round, its square overflow
        return functools.partial(torch.linalg.vector_norm, dtype=torch.float32)
    return lambda grad, /, *, out: out.copy_(torch.linalg.vector_norm(grad))  # fp64, complex


def norm_into(dtype: torch.dtype) -> NormInto:
    """The norm for a gradient of ``dtype`` (looked up at call time: tests replace it)."""
    return _norm_into(dtype)


def _dense(grad: Tensor) -> Tensor:
    """A sparse gradient (``nn.Embedding(sparse=True)``) has the norm of its summed values."""
    return grad.coalesce().values() if grad.is_sparse else grad


class NormRows:
    """The slots, the hooks that fill them, and the reads of ``.grad``."""

    def __init__(self, params: list[nn.Parameter], sharded: bool) -> None:
        self.params = params
        self.sharded = sharded  # FSDP2: .grad is this rank's shard
        self.device = params[0].device
        self.norms = torch.zeros(8, len(params), device=self.device)  # grows past 7 rows
        self._slots: list[tuple[Tensor, ...]] = [r.unbind(0) for r in self.norms]
        self.n_rows = 0  # rows filled in the current step
        self.target: list[tuple[Tensor, ...]] = [()]  # the row the coming backward writes to
        self.live = [False]  # read by every gradient hook
        self.norm_of = [norm_into(p.dtype) for p in params]  # the hooks' (and CPU's)
        # off the CPU, .grad is read with one foreach_norm per parameter dtype
        self._by_dtype: dict[torch.dtype, list[int]] = {}
        for i, p in enumerate(params):
            self._by_dtype.setdefault(p.dtype, []).append(i)

    @property
    def per_parameter(self) -> bool:
        return self.device.type in _PER_PARAMETER

    def row(self, j: int) -> tuple[Tensor, ...]:
        """The slots of row j; the rows grow, keeping theirs, for more backwards than ever."""
        if j >= len(self._slots):
            grown = torch.zeros(2 * j, len(self.params), device=self.device)
            grown[: len(self.norms)] = self.norms
            self.norms = grown
            self._slots = [r.unbind(0) for r in grown]
        return self._slots[j]

    def hook_next(self, on: bool) -> None:
        """Measure (or not) the incoming gradients of the coming backwards, into the next row.

        The hooks stay registered and only read a flag when off: unmeasured backwards compute
        nothing, and nothing is re-registered per step.
        """
        self.live[0] = on
        if on:
            self.target[0] = self.row(self.n_rows)

    def make_hook(
        self, i: int, norm: NormInto, fail: Callable[[BaseException], None]
    ) -> Callable[[Tensor], None]:
        # One kernel per parameter and backward, no allocation kept, no host sync: the norm
        # stays on the device until step() reads every row at once. Runs ~100 times per
        # backward: keep it short.
        target = self.target
        live = self.live

        def hook(grad: Tensor) -> None:
            if live[0]:
                try:  # (is_sparse checked here: no call for the usual dense gradient)
                    norm(_dense(grad) if grad.is_sparse else grad, out=target[0][i])
                except Exception as exc:  # never abort the user's backward half-way
                    fail(exc)

        return hook

    def read_grad_into(self, row: int) -> None:
        """|.grad| of every parameter that has one into row ``row`` (off the CPU, one
        ``foreach_norm`` per dtype; FSDP2: this rank's shard, the ranks' squares add up)."""
        slots = self.row(row)
        params = self.params
        if self.per_parameter:
            if self.sharded:
                for i, p in enumerate(params):
                    if (g := p.grad) is not None:
                        self.norm_of[i](local_grad(g.detach()), out=slots[i])
                return
            for i, p in enumerate(params):
                if (g := p.grad) is not None:
                    self.norm_of[i](_dense(g.detach()), out=slots[i])
            return
        for dtype, index in self._by_dtype.items():
            have = [
                (i, _dense(local_grad(g.detach())))
                for i in index
                if (g := params[i].grad) is not None
            ]
            if not have:
                continue
            grads = [g for _, g in have]
            norms = _torch_api.foreach_norm(grads, torch.float32 if dtype in _HALF else None)
            if len(have) == len(params):  # one dtype, every gradient there: the whole row
                torch.stack(norms, out=self.norms[row])
            else:
                _torch_api.foreach_copy_([slots[i] for i, _ in have], norms)

    def squares(self, slot_matrix: Tensor, n: int) -> Tensor:
        """Rows 0..n: each row's squared norms summed per slot, shape (n + 1, slots)."""
        return torch.mm(self.norms[: n + 1].square(), slot_matrix)


def series_slots(
    module: nn.Module,
    params: list[nn.Parameter],
    layers: bool | Mapping[str, Iterable[nn.Parameter]],
) -> tuple[list[str], list[int]]:
    """The series names (``layers``) and each parameter's slot among them (the last slot,
    one past the names, holds parameters outside every named group)."""
    if layers is False:
        return [], [0] * len(params)
    names: list[str] = []
    slot: dict[int, int] = {}
    if layers is True:
        for mod_name, m in module.named_modules():
            for _, p in m.named_parameters(recurse=False):
                if p.requires_grad and id(p) not in slot:
                    name = mod_name or "(model)"
                    if name not in names:
                        names.append(name)
                    slot[id(p)] = names.index(name)
    else:
        for name, group in layers.items():
            if not name:
                raise ValueError("layer group names must be non-empty ('' is the total)")
            names.append(name)
            for p in group:
                slot[id(p)] = len(names) - 1
    rest = len(names)
    return names, [slot.get(id(p), rest) for p in params]
