"""Layer rules: which modules have a cheap per-example identity, and the identity of each, in
one table (``RULES``: kind -> the factored per-example gradients of one use). Any other module
is measured by torch.func (``_fallback``).

Linear and Conv: Gram forms (``_factors.LowRank``); Embedding: a segment sum; LayerNorm, RMSNorm
and a model's own norm class over any normalized dimension (channels-last or channels-first):
(B, D) per-example gradients from x_hat; a container's own parameters (``bare``): followed to
the batch by ``_broadcast``, their gradients whole.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._factors import Factor, Flat, LowRank, wide
from ._uses import Entry, Use, tensor_at

#: kinds whose parameters are a normalization layer's (Gray et al. 2024's cheap proxy)
NORM_KINDS = frozenset({"layernorm", "rmsnorm", "norm"})

try:
    from torch.distributed.fsdp import FSDPModule
except ImportError:  # pragma: no cover - a torch built without torch.distributed
    FSDPModule = None  # type: ignore[assignment,misc]


def plain_type(module: nn.Module) -> type:
    """The module's own class: FSDP2's ``fully_shard`` swaps in a subclass ``FSDP<cls>``."""
    cls = type(module)
    if FSDPModule is not None and issubclass(cls, FSDPModule):
        return next(b for b in cls.__bases__ if not issubclass(b, FSDPModule))
    return cls


def supported_kind(module: nn.Module) -> str | None:
    """The rule of ``RULES`` that gives this module's per-example gradients, if one does."""
    cls = plain_type(module)
    if torch.nn.utils.parametrize.is_parametrized(module):
        return None  # weight_norm, spectral_norm, ...: torch.func through the parametrization
    if not {n for n, _ in module.named_parameters(recurse=False)} <= {"weight", "bias"}:
        return None  # the old hook-based weight_norm's weight_g and weight_v: torch.func
    if cls is nn.Linear:
        return "linear"
    if cls in (nn.Conv1d, nn.Conv2d):
        conv: nn.Conv1d | nn.Conv2d = module  # type: ignore[assignment]
        if conv.groups == 1 and conv.padding_mode == "zeros" and not isinstance(conv.padding, str):
            return "conv"
        return None
    if cls is nn.Embedding:
        emb = module
        assert isinstance(emb, nn.Embedding)
        # sparse=True changes how the gradient is stored, not its rows: the same identity
        if emb.max_norm is None and emb.scale_grad_by_freq is False:
            return "embedding"
        return None
    if cls is nn.EmbeddingBag:
        bag = module
        assert isinstance(bag, nn.EmbeddingBag)
        plain = bag.max_norm is None and not bag.scale_grad_by_freq
        return "embedding_bag" if plain and bag.mode in ("sum", "mean") else None
    if cls is nn.LayerNorm:
        return "layernorm"
    if cls is nn.RMSNorm:
        return "rmsnorm"
    if _affine_norm(module):
        return "affine_norm"
    # Hugging Face's Conv1D (GPT-2): y = x W + b with W (in, out); matched by name, so that
    # the probe needs no transformers import
    weight = getattr(module, "weight", None)
    if cls.__name__ == "Conv1D" and hasattr(module, "nf") and isinstance(weight, Tensor):
        return "conv1d_hf" if weight.dim() == 2 else None
    return None


def is_norm_layer(module: nn.Module) -> bool:
    """A normalization layer: torch's own, or a model's class named like one (nanoGPT's
    ``LayerNorm``, Llama's ``LlamaRMSNorm``, T5's ``T5LayerNorm``) with vector parameters."""
    cls = plain_type(module)
    if cls in (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm):
        return True
    name = cls.__name__.lower()
    own = list(module.parameters(recurse=False))
    return bool(own) and name.endswith("norm") and all(p.dim() == 1 for p in own)


def measured_parameters(module: nn.Module, norm_layers_only: bool) -> list[nn.Parameter]:
    """The parameters a probe measures: every trainable one, once, in ``module.parameters()``
    order (with ``norm_layers_only``: those of normalization layers alone, the cheap proxy of
    ``scope="norm_layers"``); ``ValueError`` when none is left."""
    params: list[nn.Parameter] = []
    seen: set[int] = set()
    if norm_layers_only:
        seen = {
            id(p) for m in module.modules() if not is_norm_layer(m) for p in m.parameters(False)
        }
    for p in module.parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            params.append(p)
    if not params:
        if norm_layers_only:
            raise ValueError(
                "scope='norm_layers' but the model has no trainable normalization layer "
                "(LayerNorm, RMSNorm, GroupNorm or a class named *Norm): use scope='all'"
            )
        raise ValueError("the model has no parameters that require gradients")
    return params


def _affine_norm(module: nn.Module) -> bool:
    """A model's own normalization class with a vector weight (and bias): nanoGPT's
    ``LayerNorm``, ``LlamaRMSNorm``, ConvNeXt's channels-first ``LayerNorm``. Whether its output
    is ``weight * x_hat + bias`` along some dimension is checked at its first use
    (``_fallback.unit_output``)."""
    own = dict(module.named_parameters(recurse=False))
    weight = own.get("weight")
    return (
        is_norm_layer(module)
        and plain_type(module) not in (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm)
        and not list(module.children())
        and set(own) <= {"weight", "bias"}
        and weight is not None
        and weight.dim() == 1
        and all(p.shape == weight.shape for p in own.values())
    )


def unsupported_reason(model: nn.Module) -> str | None:
    """Why per-example gradients are not defined for this model at all, if they are not."""
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            return (
                f"{name or '(model)'} is a BatchNorm layer: it mixes the examples of a batch, "
                "so per-example gradients are not defined"
            )
    return None


def as_btd(t: Tensor, d: int) -> Tensor:
    return wide(t.reshape(t.shape[0], -1, d))


def normalized(x: Tensor, centred: bool, eps: float) -> Tensor:
    """x_hat over the last dimension: layer normalization (``centred``) or RMS."""
    if centred:
        # a unit weight gives the same x_hat, by a faster kernel than weight=None on CPU
        d = int(x.shape[-1])
        return F.layer_norm(x, (d,), x.new_ones(d), None, eps)
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)


def conv_unfold(conv: nn.Conv1d | nn.Conv2d, x: Tensor, delta: Tensor) -> tuple[Tensor, Tensor]:
    """Patches (B, L, C_in k) and output gradients (B, L, C_out) of a conv layer."""
    if isinstance(conv, nn.Conv1d):
        x = x.unsqueeze(2)
        kernel: tuple[int, ...] = (1, conv.kernel_size[0])
        dilation: tuple[int, ...] = (1, conv.dilation[0])
        padding: tuple[int, ...] = (0, int(conv.padding[0]))
        stride: tuple[int, ...] = (1, conv.stride[0])
    else:
        kernel, dilation = tuple(conv.kernel_size), tuple(conv.dilation)
        padding = tuple(int(p) for p in conv.padding)
        stride = tuple(conv.stride)
    patches = F.unfold(wide(x), kernel, dilation=dilation, padding=padding, stride=stride)
    xs = patches.transpose(1, 2)
    ds = wide(delta).reshape(delta.shape[0], delta.shape[1], -1).transpose(1, 2)
    return xs, ds


#: one rule: (entry, use, its inputs, its output gradient, x_hat of a norm class or None)
Rule = Callable[[Entry, Use, tuple[Any, ...], Tensor, Tensor | None], dict[str, Factor]]


def _bare(
    entry: Entry, use: Use, args: tuple[Any, ...], delta: Tensor, _: Any
) -> dict[str, Factor]:
    """A container's own parameter: its per-example gradients, whole (``_broadcast``)."""
    ((name, _i),) = entry.params
    return {name: Flat(wide(delta).reshape(delta.shape[0], -1))}


def _linear_like(
    entry: Entry, use: Use, args: tuple[Any, ...], delta: Tensor, _: Any
) -> dict[str, Factor]:
    """Linear, Conv (over unfolded patches) and HF's Conv1D: g_i = sum_t delta_t x_t^T."""
    x, names = args[0], entry.names
    out: dict[str, Factor] = {}
    if entry.kind == "conv":
        conv: nn.Conv1d | nn.Conv2d = entry.module  # type: ignore[assignment]
        xs, ds = conv_unfold(conv, x, delta)
    else:
        xs, ds = as_btd(x, int(x.shape[-1])), as_btd(delta, int(delta.shape[-1]))
    # Linear and conv weights are (out, in); Conv1D's is (in, out)
    a, b = (xs, ds) if entry.kind == "conv1d_hf" else (ds, xs)
    if "weight" in names:
        out["weight"] = LowRank(b=b, a=a)
    if "bias" in names:
        out["bias"] = Flat(ds.sum(1))
    return out


def _embedding(
    entry: Entry, use: Use, args: tuple[Any, ...], delta: Tensor, _: Any
) -> dict[str, Factor]:
    """Row v of example i's gradient: the sum of its output gradients at positions with id v."""
    emb: nn.Embedding = entry.module  # type: ignore[assignment]
    ids = use.ids
    assert ids is not None
    ds = as_btd(delta, emb.embedding_dim)
    if emb.padding_idx is not None:
        ds = ds * (ids != emb.padding_idx).unsqueeze(-1)
    return {"weight": LowRank(b=ds, ids=ids)}


def _embedding_bag(
    entry: Entry, use: Use, args: tuple[Any, ...], delta: Tensor, _: Any
) -> dict[str, Factor]:
    """One example per bag: bag i's gradient has row v = the sum, over its ids equal to v, of
    its output gradient times the id's weight (1, or 1 / the bag's size under "mean", times
    ``per_sample_weights``). Bags are laid out as rows of a padded (B, longest bag) table, the
    padding with zero gradients, for the Embedding identity (and its cross terms)."""
    bag: nn.EmbeddingBag = entry.module  # type: ignore[assignment]
    names = ("input", "offsets", "per_sample_weights")
    given = dict(zip(names, args, strict=False))
    given |= {k: v for k, v in use.kwargs.items() if k in names}
    ids: Tensor = given["input"]
    offsets, weights = given.get("offsets"), given.get("per_sample_weights")
    batch, device = int(delta.shape[0]), ids.device
    if ids.dim() == 2:
        length = int(ids.shape[1])
        example = torch.arange(ids.shape[0], device=device).repeat_interleave(length)
        position = torch.arange(length, device=device).repeat(int(ids.shape[0]))
        n_bags = int(ids.shape[0])
    else:
        assert isinstance(offsets, Tensor)
        starts = offsets[:-1] if bag.include_last_offset else offsets
        token = torch.arange(ids.numel(), device=device)
        example = torch.searchsorted(starts, token, right=True) - 1
        position = token - starts[example]
        n_bags = int(starts.numel())
    flat = ids.reshape(-1)
    scale = torch.ones(flat.shape, device=device, dtype=delta.dtype)
    if isinstance(weights, Tensor):
        scale = scale * weights.reshape(-1).to(delta.dtype)
    if bag.padding_idx is not None:
        scale = scale * (flat != bag.padding_idx)
    if bag.mode == "mean":
        real = flat != bag.padding_idx if bag.padding_idx is not None else torch.ones_like(flat)
        count = torch.zeros(n_bags, device=device)
        count = count.index_add_(0, example, real.to(count.dtype))
        scale = scale / count[example].clamp(min=1).to(scale.dtype)
    measured = example < batch  # per_example_max: the first examples only
    example, position, flat, scale = (t[measured] for t in (example, position, flat, scale))
    width = int(position.max()) + 1 if position.numel() else 1
    table = torch.zeros(batch, width, dtype=flat.dtype, device=device)
    table[example, position] = flat
    ds = wide(delta).new_zeros(batch, width, int(delta.shape[-1]))
    ds[example, position] = wide(delta)[example] * scale.unsqueeze(1).to(ds.dtype)
    return {"weight": LowRank(b=ds, ids=table)}


def _norm(
    entry: Entry, use: Use, args: tuple[Any, ...], delta: Tensor, unit_output: Tensor | None
) -> dict[str, Factor]:
    """Per-example gradients: weight sum_t delta_t * x_hat_t, bias sum_t delta_t, the sums over
    every position of the normalized dimension (``entry.norm_dim``: last, or channels-first)."""
    names, x = entry.names, args[0]
    if entry.kind == "affine_norm":  # a model's own class: x_hat from _fallback.unit_output
        assert unit_output is not None
        dim = entry.norm_dim
        d = int(tensor_at(entry.module, "weight").shape[0])
        x_hat = as_btd(unit_output.movedim(dim, -1), d)
        ds = as_btd(delta.movedim(dim, -1), d)
    else:
        norm: nn.LayerNorm | nn.RMSNorm = entry.module  # type: ignore[assignment]
        d = math.prod(tuple(norm.normalized_shape))
        eps = norm.eps if norm.eps is not None else torch.finfo(x.dtype).eps
        x_hat = normalized(as_btd(x, d), entry.kind == "layernorm", eps)
        ds = as_btd(delta, d)
    out: dict[str, Factor] = {}
    if "weight" in names:
        out["weight"] = Flat((ds * x_hat).sum(1))
    if "bias" in names:
        out["bias"] = Flat(ds.sum(1))
    return out


RULES: dict[str, Rule] = {
    "bare": _bare,
    "linear": _linear_like,
    "conv": _linear_like,
    "conv1d_hf": _linear_like,
    "embedding": _embedding,
    "embedding_bag": _embedding_bag,
    "layernorm": _norm,
    "rmsnorm": _norm,
    "affine_norm": _norm,
}
