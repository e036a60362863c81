"""What measures a layer when no identity of ``_layers.RULES`` does: torch.func over the module
alone (per-example vector-Jacobian products, vmapped over the batch, exact and costlier), and
the one-time check of a model's own norm class (is its output ``weight * x_hat + bias``, and
along which dimension).

Both run the module again inside the backward: ``recompute`` is the probe's guard that keeps its
own hooks quiet meanwhile.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from ._factors import wide
from ._layers import normalized
from ._uses import Entry, Use, first_output, tensor_at

Recompute = Callable[[], contextlib.AbstractContextManager[None]]


@contextlib.contextmanager
def _fixed_parametrizations(module: nn.Module) -> Iterator[None]:
    """Parametrizations evaluated as in the forward that ran: spectral_norm's power iteration
    (training mode) is not run again, its vectors as the forward left them."""
    lists = [m for m in module.modules() if isinstance(m, parametrize.ParametrizationList)]
    modes = [(m, m.training) for p in lists for m in p.modules()]
    for m, _ in modes:
        m.training = False
    try:
        yield
    finally:
        for m, mode in modes:
            m.training = mode


def func_grads(
    entry: Entry, use: Use, args: tuple[Any, ...], delta: Tensor, dense: bool, recompute: Recompute
) -> dict[str, Tensor]:
    """Per-example gradients (``dense``) or their squared norms of the parameters ``entry``
    accounts for (its own, a parametrization's originals, a child's read directly), by
    vmap(vjp) of the module's forward (torch.func)."""
    module = entry.module
    kwargs = use.kwargs
    own = {name: tensor_at(module, name).detach() for name, _ in entry.params}
    n = int(delta.shape[0])
    # inputs with the batch are per example; others (DeBERTa's relative-position table handed
    # to each attention layer) are the same for every example
    tensor_pos = [
        i
        for i, a in enumerate(args)
        if isinstance(a, Tensor) and a.dim() > 0 and (use.batch_less or int(a.shape[0]) == n)
    ]
    batched = tuple(args[i] for i in tensor_pos)
    # keyword tensors with the batch (OPT's position ids) are per example too
    keys = [] if use.batch_less else [
        k for k, v in kwargs.items() if isinstance(v, Tensor) and v.dim() and v.shape[0] == n
    ]  # fmt: skip
    keyed = tuple(kwargs[k] for k in keys)
    # batch-less: the one input as it is; routed: an example's rows are the layer's batch
    as_is = use.batch_less or use.rows is not None

    def per_example(
        p: dict[str, Tensor], xs: tuple[Tensor, ...], ks: tuple[Tensor, ...], d: Tensor
    ) -> Tensor:
        full = list(args)
        for i, xi in zip(tensor_pos, xs, strict=True):
            full[i] = xi if as_is else xi.unsqueeze(0)
        kw = dict(kwargs)
        for k, ki in zip(keys, ks, strict=True):
            kw[k] = ki if as_is else ki.unsqueeze(0)

        def f(params: dict[str, Tensor]) -> Tensor:
            out = torch.func.functional_call(module, params, tuple(full), kw, strict=False)
            first = first_output(out)
            assert isinstance(first, Tensor)
            return first

        vjp_out = torch.func.vjp(f, p)
        cotangent = d if as_is else d.unsqueeze(0)
        (g,) = vjp_out[1](cotangent.to(delta.dtype))
        if dense:
            return torch.cat([wide(g[name]).reshape(-1) for name in p])
        return torch.stack([wide(g[name]).square().sum() for name in p])

    if use.batch_less:
        batched = tuple(a[0] for a in batched)  # the one input, not expanded
    in_dims = (None, None if use.batch_less else 0, 0, 0)
    with recompute(), torch.enable_grad(), _fixed_parametrizations(module):
        if not entry.loop:
            try:
                result = torch.func.vmap(per_example, in_dims=in_dims, randomness="same")(
                    own, batched, keyed, delta
                )
            except RuntimeError:
                # modules vmap cannot batch (nn.LSTM's in-place state updates): the same vjp,
                # one example at a time, from now on
                entry.loop = True
        if entry.loop:
            rows = []
            for i in range(int(delta.shape[0])):
                xs = batched if use.batch_less else tuple(a[i] for a in batched)
                rows.append(per_example(own, xs, tuple(k[i] for k in keyed), delta[i]))
            result = torch.stack(rows)
    if not dense:
        return {name: result[:, j] for j, name in enumerate(own)}
    out, start = {}, 0
    for name, p in own.items():
        out[name] = result[:, start : start + p.numel()]
        start += p.numel()
    return out


def unit_output(
    entry: Entry, use: Use, args: tuple[Any, ...], recompute: Recompute
) -> Tensor | None:
    """x_hat of a model's own norm class: its output at weight 1 and bias 0. At its first use
    the layer is checked to compute ``weight * x_hat + bias`` along one dimension, the last or
    another of the weight's size (ConvNeXt's channels-first ``weight[:, None, None] * x``); one
    that does not (Gemma's ``(1 + weight) * x_hat``) falls back to torch.func from then on
    (``entry.kind`` becomes ``func``, None returned). Over the last dimension x_hat is matched
    against layer and RMS normalization at the usual epsilons: a match is computed directly from
    then on, anything else by one forward of the layer."""
    x = args[0]
    if entry.formula is not None:
        return normalized(wide(x), *entry.formula)
    module = entry.module
    own = {name: tensor_at(module, name).detach() for name, _ in entry.params}
    unit = {name: torch.ones_like(p) if name == "weight" else torch.zeros_like(p)
            for name, p in own.items()}  # fmt: skip

    def call(params: dict[str, Tensor], inputs: tuple[Any, ...] = args) -> Tensor:
        out = torch.func.functional_call(module, params, inputs, use.kwargs, strict=False)
        assert isinstance(out, Tensor)
        return out

    with recompute(), torch.no_grad():
        if not entry.checked:  # on two examples: the layer's form, not its data
            entry.checked = True
            few = tuple(a[:2] if isinstance(a, Tensor) and a.dim() else a for a in args)
            unit_few = call(unit, few)
            zero = call({name: torch.zeros_like(p) for name, p in own.items()}, few)
            dim = None
            if bool(zero.abs().max() == 0):
                dim = _scaled_dim(own, unit_few, call(own, few))
            if dim is None:
                entry.kind = "func"
                return None
            entry.norm_dim = dim
            if dim == unit_few.dim() - 1:
                entry.formula = _formula(module, wide(few[0]), wide(unit_few))
            if entry.formula is not None:
                return normalized(wide(x), *entry.formula)
        return call(unit)


def _scaled_dim(own: dict[str, Tensor], unit: Tensor, actual: Tensor) -> int | None:
    """The dimension (not the batch's) along which ``actual == weight * unit + bias``: the last
    tried first, then the others of the weight's size (channels-first)."""
    size = int(own["weight"].shape[0])
    last = unit.dim() - 1
    for dim in (last, *range(1, last)):
        if int(unit.shape[dim]) != size:
            continue
        shape = [1] * unit.dim()
        shape[dim] = size
        expected = own["weight"].view(shape) * unit
        if "bias" in own:
            expected = expected + own["bias"].view(shape)
        if _close(actual, expected):
            return int(dim)
    return None


def _close(a: Tensor, b: Tensor) -> bool:
    return torch.allclose(a, b, rtol=1e-4, atol=1e-6 * float(a.abs().max()))


def _formula(module: nn.Module, x: Tensor, x_hat: Tensor) -> tuple[bool, float] | None:
    """Which normalization a model's norm class computes, if a usual one: (centred, eps)."""
    named = [getattr(module, a, None) for a in ("eps", "variance_epsilon", "epsilon")]
    candidates = [e for e in named if isinstance(e, float)] + [1e-5, 1e-6, 1e-12, 1e-8]
    # the first as close as the layer's own precision allows (its own epsilon is tried first)
    tolerance = 50 * torch.finfo(x_hat.dtype).eps * (float(x_hat.abs().max()) or 1.0)
    for eps in candidates:
        for centred in (True, False):
            if float((normalized(x, centred, eps) - x_hat).abs().max()) <= tolerance:
                return centred, eps
    return None
