"""Per-example squared gradient norms without per-example gradients (B_small = 1).

For a layer y = x W^T + b applied at T positions of example i, the per-example gradient is
g_i = sum_t delta_it x_it^T, so (Goodfellow 2015; Li et al. 2022 "ghost norm"; Gray et al.
2023/2024, nanoGNS)::

    |g_i|^2 = sum_{t,s} (delta_it . delta_is)(x_it . x_is)       (T x T Gram matrices)

or, when cheaper, |delta_i^T x_i|_F^2 with the (d_out x d_in) product formed per example. We save
each layer's input in a forward hook and read delta = dL/dy from a tensor hook on the output,
so nothing but a length-B vector per parameter is kept. Conv layers are Linear layers over
unfolded patches; Embedding sums the output gradients of each (example, token id) pair;
LayerNorm's affine parameters have cheap (B, D) per-example gradients. Any other module that
owns parameters falls back to ``torch.func``: per-example vector-Jacobian products of the
module alone, vmapped over the batch (exact, costlier). Batch is dimension 0 of each module's
first input and output.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from ._instrument import Wrap, _identity

PerExampleMethod = Literal["auto", "identities", "func"]


def _linear_sq(x: Tensor, delta: Tensor) -> tuple[Tensor, Tensor]:
    """Per-example |grad W|^2 = |sum_t delta_t x_t^T|_F^2 and |grad b|^2 = |sum_t delta_t|^2.

    x: (B, T, d_in), delta: (B, T, d_out). The bias term falls out of whichever form is used.
    """
    t, d_in, d_out = x.shape[1], x.shape[2], delta.shape[2]
    if t == 1:
        delta_sq = delta.square().sum((1, 2))
        return delta_sq * x.square().sum((1, 2)), delta_sq
    if t * (d_in + d_out) <= d_in * d_out:
        gram_x = torch.bmm(x, x.transpose(1, 2))
        gram_d = torch.bmm(delta, delta.transpose(1, 2))
        return (gram_x * gram_d).sum((1, 2)), gram_d.sum((1, 2))
    weight_sq = torch.bmm(delta.transpose(1, 2), x).square().sum((1, 2))
    return weight_sq, delta.sum(1).square().sum(1)


def _embedding_sq(ids: Tensor, delta: Tensor, n_rows: int) -> Tensor:
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


def _as_btd(t: Tensor, d: int) -> Tensor:
    return t.reshape(t.shape[0], -1, d).float()


class _Entry:
    """One hooked module: how to turn (saved input, output gradient) into per-example norms."""

    def __init__(
        self,
        module: nn.Module,
        params: list[tuple[str, int]],
        kind: str,
    ) -> None:
        self.module = module
        self.params = params  # (attribute name, global parameter index)
        self.kind = kind
        self.names = dict(params)
        self.ones: Tensor | None = None  # LayerNorm: a unit weight for recomputing x_hat


try:
    from torch.distributed.fsdp import FSDPModule
except ImportError:  # pragma: no cover - a torch built without torch.distributed
    FSDPModule = None  # type: ignore[assignment,misc]


def _plain_type(module: nn.Module) -> type:
    """The module's own class: FSDP2's ``fully_shard`` swaps in a subclass ``FSDP<cls>``."""
    cls = type(module)
    if FSDPModule is not None and issubclass(cls, FSDPModule):
        return next(b for b in cls.__bases__ if not issubclass(b, FSDPModule))
    return cls


def _supported_kind(module: nn.Module) -> str | None:
    cls = _plain_type(module)
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
    if cls is nn.LayerNorm:
        return "layernorm"
    return None


class PerExampleNorms:
    """Hooks that compute, per backward, each parameter's per-example squared gradient norms."""

    def __init__(
        self,
        model: nn.Module,
        param_index: dict[int, int],
        method: PerExampleMethod = "auto",
        max_examples: int | None = None,
        wrap: Wrap = _identity,
    ) -> None:
        self._wrap = wrap  # profiling (``noisescope.torch.instrumented``)
        if method not in ("auto", "identities", "func"):
            raise ValueError(f"per_example must be 'auto', 'identities' or 'func', got {method!r}")
        self.n_params = len(param_index)
        self.armed = False
        # called with an error raised while computing norms in the backward (instead of
        # raising it there, which would abort the user's backward half-way); None: raise
        self.on_error: Callable[[BaseException], None] | None = None
        self._recomputing = False
        self._results: dict[int, Tensor] = {}
        self._calls: dict[int, int] = {}
        if max_examples is not None and max_examples < 1:
            raise ValueError(f"max_examples must be at least 1, got {max_examples}")
        self.max_examples = max_examples
        self.last_full_batch = 0  # examples in the batch behind the last take()
        self._batch: int | None = None
        self._batch_seen: int | None = None
        self._handles: list[RemovableHandle] = []
        self.entries: list[_Entry] = []
        owners: dict[int, str] = {}
        for mod_name, module in model.named_modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                raise ValueError(
                    f"{mod_name or '(model)'} is a BatchNorm layer: it mixes the examples of a "
                    "batch, so per-example gradients are not defined; use source='micro' "
                    "(gradient accumulation or DDP) for this model"
                )
            direct = [
                (name, p)
                for name, p in module.named_parameters(recurse=False)
                if id(p) in param_index
            ]
            if not direct:
                continue
            for name, p in direct:
                if id(p) in owners:
                    raise ValueError(
                        f"parameter {mod_name or '(model)'}.{name} is shared with "
                        f"{owners[id(p)]} (tied weights): per-example norms need each parameter "
                        "in one module; use source='micro' (accumulation/DDP) for this model"
                    )
                owners[id(p)] = f"{mod_name or '(model)'}.{name}"
            own = [(name, param_index[id(p)]) for name, p in direct]
            kind = _supported_kind(module) if method != "func" else None
            if kind is None and method == "identities":
                raise ValueError(
                    f"module {mod_name or '(model)'} ({type(module).__name__}) has no cheap "
                    "per-example identity; use per_example='auto' to fall back to torch.func"
                )
            entry = _Entry(module, own, kind or "func")
            self.entries.append(entry)
            self._handles.append(
                module.register_forward_hook(
                    wrap(self._make_forward_hook(entry), False), with_kwargs=True
                )
            )

    @property
    def methods(self) -> dict[str, int]:
        """How many modules use each method (for the docs and the user's sanity)."""
        out: dict[str, int] = {}
        for e in self.entries:
            out[e.kind] = out.get(e.kind, 0) + 1
        return out

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _make_forward_hook(
        self, entry: _Entry
    ) -> Callable[[nn.Module, tuple[Any, ...], dict[str, Any], Any], None]:
        def hook(
            module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
        ) -> None:
            if not self.armed or self._recomputing or not torch.is_grad_enabled():
                return
            out = output[0] if isinstance(output, tuple) else output
            if not isinstance(out, Tensor) or not out.requires_grad:
                return
            key = id(entry)
            self._calls[key] = self._calls.get(key, 0) + 1
            if self._calls[key] > 1:
                raise RuntimeError(
                    f"{type(module).__name__} ran twice in one forward pass; its per-example "
                    "gradient is a sum over both uses, which per-example norms cannot split. "
                    "Use source='micro' (accumulation or DDP) for this model."
                )
            first = args[0] if args and isinstance(args[0], Tensor) else None
            batch = int(first.shape[0]) if first is not None and first.dim() > 0 else None
            if batch is None or int(out.shape[0]) != batch:
                raise RuntimeError(
                    f"{type(module).__name__} got an input without a leading batch dimension "
                    f"(shape {tuple(first.shape) if first is not None else None}); per-example "
                    "norms need batch-first inputs. For a positional embedding, index it with "
                    "positions expanded to (batch, T), or use source='micro'."
                )
            if self._batch_seen is None:
                self._batch_seen = batch
            elif batch != self._batch_seen:
                raise RuntimeError(
                    f"{type(module).__name__} saw a first dimension of {batch}, other layers "
                    f"{self._batch_seen}: per-example norms need every parametrised layer to "
                    "see batch-first inputs. For a positional embedding computed once for all "
                    "examples, index it with positions expanded to (batch, T), or use "
                    "source='micro'."
                )
            # Only the first max_examples examples are measured: cost scales with their number.
            keep = self.max_examples if self.max_examples and self.max_examples < batch else None

            def head(t: Tensor) -> Tensor:
                t = t.detach()
                return t[:keep] if keep is not None and t.dim() and t.shape[0] == batch else t

            saved_args = tuple(head(a) if isinstance(a, Tensor) else a for a in args)

            def on_grad(delta: Tensor) -> None:
                if not self.armed:  # stopped after an error earlier in this backward
                    return
                try:
                    self._backward(entry, saved_args, kwargs, head(delta))
                except Exception as exc:
                    if self.on_error is None:
                        raise
                    self.on_error(exc)

            out.register_hook(self._wrap(on_grad, True))

        return hook

    def _store(self, idx: int, sq: Tensor) -> None:
        prev = self._results.get(idx)
        self._results[idx] = sq if prev is None else prev + sq
        if self._batch is None:
            self._batch = int(sq.shape[0])

    def _store_pair(self, names: dict[str, int], weight_sq: Tensor, bias_sq: Tensor) -> None:
        if "weight" in names:
            self._store(names["weight"], weight_sq)
        if "bias" in names:
            self._store(names["bias"], bias_sq)

    def _backward(
        self, entry: _Entry, args: tuple[Any, ...], kwargs: dict[str, Any], delta: Tensor
    ) -> None:
        m = entry.module
        names = entry.names
        if entry.kind == "func":
            for name, sq in self._func_norms(entry, args, kwargs, delta).items():
                self._store(names[name], sq)
            return
        x = args[0]
        if entry.kind == "linear":
            lin: nn.Linear = m  # type: ignore[assignment]
            weight_sq, bias_sq = _linear_sq(
                _as_btd(x, lin.in_features), _as_btd(delta, lin.out_features)
            )
            self._store_pair(names, weight_sq, bias_sq)
        elif entry.kind == "conv":
            conv: nn.Conv1d | nn.Conv2d = m  # type: ignore[assignment]
            self._store_pair(names, *_linear_sq(*self._conv_unfold(conv, x, delta)))
        elif entry.kind == "embedding":
            emb: nn.Embedding = m  # type: ignore[assignment]
            ids = x.reshape(x.shape[0], -1)
            ds = _as_btd(delta, emb.embedding_dim)
            if emb.padding_idx is not None:
                ds = ds * (ids != emb.padding_idx).unsqueeze(-1)
            self._store(names["weight"], _embedding_sq(ids, ds, emb.num_embeddings))
        elif entry.kind == "layernorm":
            ln: nn.LayerNorm = m  # type: ignore[assignment]
            d = math.prod(ln.normalized_shape)
            xf = x.float()
            if entry.ones is None or entry.ones.device != xf.device:
                entry.ones = torch.ones(ln.normalized_shape, device=xf.device)
            # a unit weight gives the same x_hat, by a faster kernel than weight=None on CPU
            x_hat = F.layer_norm(xf, ln.normalized_shape, entry.ones, None, ln.eps)
            xs = x_hat.reshape(x.shape[0], -1, d)
            ds = _as_btd(delta, d)
            # per-example grads: weight sum_t delta_t * x_hat_t, bias sum_t delta_t; (2, B, D)
            grads = torch.stack([(ds * xs).sum(1), ds.sum(1)])
            weight_sq, bias_sq = grads.square().sum(2)
            self._store_pair(names, weight_sq, bias_sq)

    @staticmethod
    def _conv_unfold(
        conv: nn.Conv1d | nn.Conv2d, x: Tensor, delta: Tensor
    ) -> tuple[Tensor, Tensor]:
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
        patches = F.unfold(x.float(), kernel, dilation=dilation, padding=padding, stride=stride)
        xs = patches.transpose(1, 2)
        ds = delta.float().reshape(delta.shape[0], delta.shape[1], -1).transpose(1, 2)
        return xs, ds

    def _func_norms(
        self, entry: _Entry, args: tuple[Any, ...], kwargs: dict[str, Any], delta: Tensor
    ) -> dict[str, Tensor]:
        """Per-example |grad|^2 of the module's own parameters via vmap(vjp) (torch.func)."""
        module = entry.module
        own = {name: getattr(module, name).detach() for name, _ in entry.params}
        tensor_pos = [i for i, a in enumerate(args) if isinstance(a, Tensor) and a.dim() > 0]
        batched = tuple(args[i] for i in tensor_pos)

        def per_example(p: dict[str, Tensor], xs: tuple[Tensor, ...], d: Tensor) -> Tensor:
            full = list(args)
            for i, xi in zip(tensor_pos, xs, strict=True):
                full[i] = xi.unsqueeze(0)

            def f(params: dict[str, Tensor]) -> Tensor:
                out = torch.func.functional_call(module, params, tuple(full), kwargs, strict=False)
                first = out[0] if isinstance(out, tuple) else out
                assert isinstance(first, Tensor)
                return first

            vjp_out = torch.func.vjp(f, p)
            (g,) = vjp_out[1](d.unsqueeze(0).to(delta.dtype))
            return torch.stack([g[name].float().square().sum() for name in p])

        self._recomputing = True
        try:
            with torch.enable_grad():
                sq = torch.func.vmap(per_example, in_dims=(None, 0, 0), randomness="same")(
                    own, batched, delta
                )
        finally:
            self._recomputing = False
        return {name: sq[:, j] for j, name in enumerate(own)}

    @property
    def captured(self) -> bool:
        """Whether the last backward gave any per-example norm."""
        return self._batch is not None

    def take(self, device: torch.device) -> Tensor:
        """Per-parameter per-example squared norms of the last backward, shape (n_params, B)."""
        if self._batch is None:
            raise RuntimeError(
                "no per-example gradients were captured: run the forward pass and "
                "loss.backward() (with grad enabled) before probe.micro_step()/step()"
            )
        batch = self._batch
        self.last_full_batch = self._batch_seen or batch
        zero = torch.zeros(batch, device=device)
        rows = [self._results.get(i, zero) for i in range(self.n_params)]
        if any(r.device != device for r in rows):
            rows = [r.to(device) for r in rows]
        self.reset()
        return torch.stack(rows)

    def reset(self) -> None:
        self._results = {}
        self._calls = {}
        self._batch = None
        self._batch_seen = None

    def per_slot(
        self, slot: Tensor, n_slots: int, item_counts: Sequence[float] | Tensor | None
    ) -> tuple[Tensor, Tensor | None, int]:
        """The last backward's per-example squared norms summed per series slot, shape
        (n_slots, measured examples); the measured examples' item counts; the batch size."""
        device = slot.device
        counts = None
        if item_counts is not None:
            counts = torch.as_tensor(item_counts, dtype=torch.float32, device=device)
        per_param = self.take(device)
        n_full = self.last_full_batch
        small = torch.zeros(n_slots, per_param.shape[1], device=device).index_add_(
            0, slot, per_param
        )
        if counts is not None:
            if counts.shape[0] != n_full:
                raise ValueError(
                    f"item_counts has {counts.shape[0]} entries but the batch has {n_full} examples"
                )
            counts = counts[: small.shape[1]]
        return small, counts, n_full
