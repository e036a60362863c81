"""The least work a gradient-noise probe of each kind must do, timed beside the probe in
``benchmarks.probe_overhead`` (and ``probe_gpt``): for the micro-batch sources, one norm of each
measured backward's gradient while it is fresh and one batched norm of the accumulated gradient
at the step; for per-example norms, the Linear layers' per-example products (Gram matrices) or
their norm-layer counterpart. ``ProbeFactory`` is what each case attaches."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
import torch._dynamo.config
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.hooks import RemovableHandle

from benchmarks._meter import Meter
from noisescope.torch import _factors


class Probe(Protocol):
    def micro_step(self, batch_size: float) -> None: ...
    def step(self, *, loss: float, lr: float) -> object: ...
    def remove(self) -> None: ...


ProbeFactory = Callable[[nn.Module], Probe]


class LeastReads:
    """The least a micro-batch probe must do: one norm of each measured backward's gradient,
    read while fresh (a post-accumulate hook: the first backward's ``.grad`` is its gradient;
    a later one's holds as many bytes), one batched norm of the accumulated gradient at the
    step, and under DDP one small all-reduce. No bookkeeping, nothing logged."""

    def __init__(self, model: nn.Module, meter: Meter, first_only: bool) -> None:
        self._ddp = isinstance(model, nn.parallel.DistributedDataParallel)
        inner = model.module if self._ddp else model
        assert isinstance(inner, nn.Module)
        self._params = [p for p in inner.parameters() if p.requires_grad]
        self._live = [True]
        self._first_only = first_only
        self._reads = meter.wrap(self._read_step)
        slots = torch.zeros(len(self._params)).unbind(0)
        self._handles = [
            p.register_post_accumulate_grad_hook(meter.wrap(self._hook(slot), hook=True))
            for p, slot in zip(self._params, slots, strict=True)
        ]

    def _hook(self, slot: Tensor) -> Callable[[Tensor], None]:
        live = self._live

        def hook(param: Tensor) -> None:
            if live[0]:
                torch.linalg.vector_norm(param.grad, out=slot)

        return hook

    def _read_step(self) -> None:
        torch._foreach_norm([p.grad for p in self._params if p.grad is not None])
        if self._ddp:
            dist.all_reduce(torch.zeros(8, dtype=torch.float64))

    def micro_step(self, batch_size: float) -> None:
        if self._first_only:
            self._live[0] = False

    def step(self, *, loss: float, lr: float) -> None:
        self._reads()
        self._live[0] = True

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def _linear_sq(x: Tensor, delta: Tensor) -> Tensor:
    """A Linear layer's per-example squared weight-gradient norms, by the probe's own identity
    (``_factors.lowrank_sq``: the T x T Grams or the per-example product, the cheaper)."""
    return _factors.lowrank_sq(delta, x)


class LeastHooks:
    """A least-work reference made of forward hooks: the probe's calls do nothing else."""

    _handles: list[RemovableHandle]

    def micro_step(self, batch_size: float) -> None:
        pass

    def step(self, *, loss: float, lr: float) -> None:
        pass

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


class LeastGram(LeastHooks):
    """The least a per-example probe must do: each Linear layer's per-example products (the
    probe's own Gram/outer-product identity, metered), from its saved input and its output's
    gradient. Nothing else: no other layer, no sums, nothing logged."""

    def __init__(self, model: nn.Module, meter: Meter) -> None:
        inner = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
        assert isinstance(inner, nn.Module)
        self._gram = meter.wrap(_linear_sq, hook=True)
        self._handles = [
            m.register_forward_hook(self._forward) for m in inner.modules() if type(m) is nn.Linear
        ]

    def _forward(self, module: nn.Module, args: tuple[Tensor, ...], out: Tensor) -> None:
        if not (torch.is_grad_enabled() and out.requires_grad):
            return
        x = args[0].detach()
        x = x.reshape(x.shape[0], -1, x.shape[-1])

        def on_grad(delta: Tensor) -> None:
            self._gram(x, delta.reshape(delta.shape[0], -1, delta.shape[-1]))

        out.register_hook(on_grad)


class LeastNorm(LeastHooks):
    """The least a norm-layer probe (``scope="norm_layers"``) must do: each LayerNorm's
    per-example weight and bias gradients (sum over positions of delta * x_hat, and of delta),
    from its saved input and its output's gradient, and their squared norms. Matches
    ``nn.LayerNorm`` and classes named ``LayerNorm`` (nanoGPT's, with an optional bias)."""

    def __init__(self, model: nn.Module, meter: Meter) -> None:
        self._norm = meter.wrap(self._per_example, hook=True)
        self._handles = [
            m.register_forward_hook(self._forward)
            for m in model.modules()
            if type(m).__name__ == "LayerNorm"
        ]

    @staticmethod
    def _per_example(x: Tensor, delta: Tensor) -> Tensor:
        d = x.shape[-1]
        x_hat = F.layer_norm(x.reshape(x.shape[0], -1, d), (d,))
        ds = delta.reshape(delta.shape[0], -1, d)
        return (ds * x_hat).sum(1).square().sum(1) + ds.sum(1).square().sum(1)

    def _forward(self, module: nn.Module, args: tuple[Tensor, ...], out: Tensor) -> None:
        if not (torch.is_grad_enabled() and out.requires_grad):
            return
        x = args[0].detach()

        def on_grad(delta: Tensor) -> None:  # returns nothing: the gradient is left as it is
            self._norm(x, delta)

        out.register_hook(on_grad)
