"""Per-example squared gradient norms without per-example gradients (B_small = 1).

Each module owning measured parameters gets a forward hook. At every call (a *use*) it saves
the module's input and reads the output gradient delta = dL/dy from a tensor hook on the
output; the backward then gives each parameter's per-example squared norms from the
identities of ``_factors`` (Linear and Conv: Gram forms; Embedding: a segment sum; LayerNorm
and RMSNorm: (B, D) per-example gradients). Any other module falls back to ``torch.func``:
per-example vector-Jacobian products of the module alone, vmapped over the batch (exact,
costlier). What real models do on top of that (docs/science.md):

- a parameter with several uses (a tied embedding and head, an encoder-decoder's shared
  embedding, a module called twice) gets the cross terms between its uses (``_factors.inner``);
- a batch-less output (positions ``arange(T)`` broadcast over the batch, BERT's position
  buffers, T5's relative attention bias) is followed to its broadcast (``_broadcast``);
- gradient checkpointing's recomputed forwards are not counted twice.

What cannot be measured exactly (a layer fed rows that are not the batch's examples, e.g. an
expert that sees only the tokens routed to it) is never guessed: the step is reported as
``Unsupported`` with the reason, and the probe decides what to do. Batch is dimension 0 of each
module's first input and output.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from ._broadcast import Capture
from ._factors import Factor, Flat, LowRank, gather_for, inner, sq_norm, wide
from ._instrument import Wrap, _identity

PerExampleMethod = Literal["auto", "identities", "func"]

#: kinds whose parameters are a normalization layer's (Gray et al. 2024's cheap proxy)
NORM_KINDS = frozenset({"layernorm", "rmsnorm", "norm"})


class Unsupported(Exception):
    """This step's per-example norms cannot be computed exactly (the message says why).
    ``retry``: the next steps can be (the layer moved to torch.func), only this one is lost."""

    def __init__(self, reason: str, retry: bool = False) -> None:
        super().__init__(reason)
        self.retry = retry


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
    cls = _plain_type(module)
    if cls in (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm):
        return True
    name = cls.__name__.lower()
    own = list(module.parameters(recurse=False))
    return bool(own) and name.endswith("norm") and all(p.dim() == 1 for p in own)


def _has_parametrised_children(module: nn.Module) -> bool:
    """A container whose own parameters are used between its children's calls (a leaf with an
    activation module, like Mixtral's experts, is recomputed whole by torch.func instead)."""
    return any(any(True for _ in child.parameters()) for child in module.children())


def _affine_norm(module: nn.Module) -> bool:
    """A model's own normalization class over the last dimension with a vector weight (and
    bias): nanoGPT's ``LayerNorm``, ``LlamaRMSNorm``, ``T5LayerNorm``. Whether its output is
    ``weight * x_hat + bias`` is checked at its first use (``_unit_output``)."""
    own = dict(module.named_parameters(recurse=False))
    weight = own.get("weight")
    return (
        is_norm_layer(module)
        and _plain_type(module) not in (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm)
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


class _Entry:
    """One hooked module: its measured parameters and the identity that gives their norms."""

    def __init__(self, module: nn.Module, label: str, params: list[tuple[str, int]], kind: str):
        self.module = module
        self.label = label
        self.params = params  # (attribute name, global parameter index)
        self.kind = kind
        self.names = dict(params)
        self.loop = False  # torch.func: vmap failed on this module, one example at a time
        self.checked = False  # affine_norm: its output checked to be weight * x_hat + bias
        self.formula: tuple[bool, float] | None = None  # affine_norm: (centred, eps) of x_hat
        self.host_checks = 3  # batch-less uses: steps left to check on the host (_broadcast)

    def checking(self) -> bool:
        """Whether this use of a batch-less output is checked on the host (the first few)."""
        self.host_checks -= 1
        return self.host_checks >= 0


class _Use:
    """One call of a hooked module in a forward pass."""

    def __init__(
        self, serial: int, entry: _Entry, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        self.serial = serial
        self.entry = entry
        self.args = args
        self.kwargs = kwargs
        self.batch_less = False  # the input has no batch dimension (positions, buffers)
        self.ids: Tensor | None = None  # an embedding's (B, T) ids, known at the forward
        self.rows: Tensor | None = None  # routed: the example of each input row
        self.factors: dict[int, Factor] = {}  # parameter index -> its gradient, once done
        self.done = False


def _in_backward() -> bool:
    """Inside a backward pass (a forward recomputed by gradient checkpointing); never while
    traced by torch.compile, where the call would break the graph."""
    if torch.compiler.is_compiling():
        return False
    return bool(torch._C._current_graph_task_id() != -1)


def _first_tensor(args: Sequence[Any], kwargs: dict[str, Any]) -> Tensor | None:
    for a in (*args, *kwargs.values()):
        if isinstance(a, Tensor) and a.dim() > 0:
            return a
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
        if max_examples is not None and max_examples < 1:
            raise ValueError(f"max_examples must be at least 1, got {max_examples}")
        if reason := unsupported_reason(model):
            raise ValueError(
                f"{reason}; use source='micro' (gradient accumulation or DDP) for this model"
            )
        self.n_params = len(param_index)
        self.max_examples = max_examples
        self.armed = False
        # called with an error raised while computing norms (instead of raising it inside the
        # user's forward or backward); None: raise
        self.on_error: Callable[[BaseException], None] | None = None
        self._recomputing = False
        self.last_full_batch = 0  # examples in the batch behind the last take()
        self._handles: list[RemovableHandle] = []
        self.entries: list[_Entry] = []
        self._owners: dict[int, list[_Entry]] = {}  # parameter index -> modules owning it
        self._batch_hint: int | None = None  # from the model's own input
        self._root_ids_ndim: int | None = None  # ndim of the model's input ids, if any
        self._captures: list[Capture] = []  # on parameters: their hooks end with the step
        self.reset()
        self._handles.append(
            model.register_forward_pre_hook(wrap(self._see_input, False), with_kwargs=True)
        )
        for mod_name, module in model.named_modules():
            direct = [
                (name, param_index[id(p)])
                for name, p in module.named_parameters(recurse=False)
                if id(p) in param_index
            ]
            if not direct:
                continue
            label = mod_name or "(model)"
            kind = _supported_kind(module) if method != "func" else None
            if kind is None and method == "identities":
                raise ValueError(
                    f"module {label} ({type(module).__name__}) has no cheap per-example "
                    "identity; use per_example='auto' to fall back to torch.func"
                )
            if kind is None and method == "auto" and _has_parametrised_children(module):
                # a container's own parameters (a position table, a cls token, a layer
                # scale), used in its forward between its children: followed to the batch
                entries = [_Entry(module, label, [one], "bare") for one in direct]
                self._handles += self._bare_hooks(module, entries)
            else:
                entries = [_Entry(module, label, direct, kind or "func")]
            for entry in entries:
                for _, idx in entry.params:
                    self._owners.setdefault(idx, []).append(entry)
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

    @property
    def shared(self) -> list[str]:
        """Parameters owned by several modules (tied weights), as 'module.param' names."""
        return [
            " = ".join(f"{e.label}.{_name_of(e, idx)}" for e in owners)
            for idx, owners in self._owners.items()
            if len(owners) > 1
        ]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def reset(self) -> None:
        for capture in self._captures:
            capture.close()
        self._captures.clear()
        self._results: dict[int, Tensor] = {}
        self._uses: dict[int, list[_Use]] = {}  # id(entry) -> this step's uses
        self._serial = 0
        self._batch: int | None = None
        self._batch_seen: int | None = None
        self._unsupported: str | None = None
        self._retry = True  # every layer that could not be measured has moved to torch.func

    @property
    def _batch_size(self) -> int | None:
        """The batch's size: the first dimension of the model's own input, else that of the
        first batch-first layer this step."""
        return self._batch_hint if self._batch_hint is not None else self._batch_seen

    def _new_use(self, entry: _Entry, kwargs: dict[str, Any]) -> _Use:
        """A call of ``entry``'s module this step, numbered (cross terms are keyed by it)."""
        self._serial += 1
        return _Use(self._serial, entry, (), kwargs)

    # --- the forward --------------------------------------------------------------------

    def _see_input(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """The model's own input: the batch size, before any layer is called."""
        first = _first_tensor(args, kwargs)
        if first is not None and not _in_backward():
            self._batch_hint = int(first.shape[0])
            is_ids = not first.is_floating_point() and not first.is_complex()
            self._root_ids_ndim = first.dim() if is_ids else None

    def _make_forward_hook(
        self, entry: _Entry
    ) -> Callable[[nn.Module, tuple[Any, ...], dict[str, Any], Any], Any]:
        def hook(
            module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
        ) -> Any:
            if not self.armed or self._recomputing or not torch.is_grad_enabled():
                return None
            try:
                return self._forward(entry, args, kwargs, output)
            except Exception as exc:  # never inside the user's forward
                self._error(exc)
                return None

        return hook

    def _forward(
        self, entry: _Entry, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> Any:
        out = output[0] if isinstance(output, tuple) else output
        if entry.kind == "bare" or not isinstance(out, Tensor) or not out.requires_grad:
            return None
        uses = self._uses.setdefault(id(entry), [])
        if _in_backward() and uses:
            return None  # gradient checkpointing recomputes a forward already counted
        first = _first_tensor(args, kwargs)
        batch = self._batch_size
        lead = int(out.shape[0]) if out.dim() else None
        batch_first = (
            first is not None
            and lead is not None
            and int(first.shape[0]) == lead
            and (batch is None or lead == batch)
            and not (
                entry.kind == "embedding"
                and self._root_ids_ndim is not None
                and first.dim() < self._root_ids_ndim
            )
        )
        use = self._new_use(entry, kwargs)
        if batch_first:
            assert lead is not None
            if self._batch_seen is None:
                self._batch_seen = lead
            keep = self._keep(lead)
            use.args = tuple(_head(a, keep, lead) for a in args)
            use.kwargs = {k: _head(v, keep, lead) for k, v in kwargs.items()}
            if entry.kind == "embedding" and isinstance(use.args[0], Tensor):
                use.ids = use.args[0].reshape(use.args[0].shape[0], -1)
            uses.append(use)
            out.register_hook(self._wrap(lambda delta: self._backward(use, delta, keep), True))
            return None
        # batch-less: one value for all examples (positions, buffers), broadcast later
        batch_less = lead == 1 or first is None or not first.is_floating_point()
        if batch_less and batch is not None and not isinstance(output, tuple):
            use.args = tuple(a.detach() if isinstance(a, Tensor) else a for a in args)
            use.batch_less = True
            uses.append(use)
            keep = self._keep(batch)
            capture = Capture(
                out,
                batch,
                self._wrap(lambda delta: self._backward(use, delta, keep), True),
                lambda why: self._cannot(entry, why),
                entry.checking(),
            )
            return capture.wrap(out)
        rows = _routed_rows(first, batch) if first is not None and batch is not None else None
        if rows is not None and lead is not None:
            # rows picked out of the batch (an expert's tokens): each row's example is known
            use.args = tuple(a.detach() if isinstance(a, Tensor) else a for a in args)
            use.rows = rows
            uses.append(use)
            out.register_hook(self._wrap(lambda delta: self._backward(use, delta, None), True))
            return None
        shape = tuple(first.shape) if first is not None else None
        self._cannot(
            entry,
            f"got an input of shape {shape} whose first dimension is not the batch's "
            f"({batch}): its rows are not the batch's examples (e.g. an expert fed only the "
            "tokens routed to it, or a sequence-first layer)",
        )
        return None

    def _bare_hooks(self, module: nn.Module, entries: list[_Entry]) -> list[RemovableHandle]:
        """For the module's forward, its own parameters are BatchLess views of themselves
        (``_broadcast``): their uses are followed to the batch; put back after the forward,
        also when it raises."""
        swapped: list[dict[str, Tensor]] = []

        def before(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            views: dict[str, Tensor] = {}
            swapped.append(views)
            if not self.armed or self._recomputing or not torch.is_grad_enabled():
                return
            if torch.compiler.is_compiling():
                return
            if _in_backward() and any(self._uses.get(id(e)) for e in entries):
                return  # gradient checkpointing recomputes a forward already counted
            batch = self._batch_size
            for entry in entries:
                name, _ = entry.params[0]
                param = module._parameters.get(name)
                if entry.kind != "bare" or param is None or not param.requires_grad:
                    continue
                if batch is None:
                    self._cannot(entry, "the batch size was not known before its first use")
                    continue
                views[name] = param
                module._parameters[name] = self._capture(entry, param, batch)  # type: ignore[assignment]

        def after(
            module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any
        ) -> None:
            if swapped:
                for name, param in swapped.pop().items():
                    module._parameters[name] = param  # type: ignore[assignment]

        return [
            module.register_forward_pre_hook(self._wrap(before, False), with_kwargs=True),
            module.register_forward_hook(
                self._wrap(after, False), with_kwargs=True, always_call=True
            ),
        ]

    def _capture(self, entry: _Entry, param: Tensor, batch: int) -> Tensor:
        use = self._new_use(entry, {})
        use.batch_less = True
        self._uses.setdefault(id(entry), []).append(use)
        keep = self._keep(batch)

        def failed(why: str) -> None:
            entry.kind = "func"  # exact, costlier: from the next step on
            self._cannot(entry, why, retry=True)

        capture = Capture(
            param,
            batch,
            self._wrap(lambda delta: self._backward(use, delta, keep), True),
            failed,
            entry.checking(),
        )
        self._captures.append(capture)
        return capture.wrap(param)

    def _keep(self, batch: int) -> int | None:
        """Only the first max_examples examples are measured: cost scales with their number."""
        return self.max_examples if self.max_examples and self.max_examples < batch else None

    def _cannot(self, entry: _Entry, why: str, retry: bool = False) -> None:
        self._retry = self._retry and retry
        if self._unsupported is None:
            self._unsupported = (
                f"per-example gradients of {entry.label} ({type(entry.module).__name__}) "
                f"cannot be computed exactly: {why}"
            )

    def _error(self, exc: BaseException) -> None:
        if self.on_error is None:
            raise exc
        self.on_error(exc)

    # --- the backward -------------------------------------------------------------------

    def _backward(self, use: _Use, delta: Tensor, keep: int | None) -> None:
        if not self.armed:  # stopped after an error earlier in this backward
            return
        try:
            self._measure(use, _head(delta.detach(), keep, int(delta.shape[0])))
        except Exception as exc:
            self._error(exc)

    def _measure(self, use: _Use, delta: Tensor) -> None:
        entry = use.entry
        args = use.args
        if use.rows is not None:  # routed rows -> (B, rows of each example, ...), zero-padded
            n_batch = self._batch_size or 0
            args, kwargs, delta = _by_example(use.rows, n_batch, args, use.kwargs, delta)
            keep = self._keep(n_batch)
            args = tuple(_head(a, keep, n_batch) for a in args)
            use.kwargs = {k: _head(v, keep, n_batch) for k, v in kwargs.items()}
            delta = _head(delta, keep, n_batch)
        batch = int(delta.shape[0])
        if use.batch_less:  # the same input for every example: (B, *shape)
            args = tuple(
                a.unsqueeze(0).expand(batch, *a.shape) if isinstance(a, Tensor) and a.dim() else a
                for a in args
            )
            if entry.kind == "embedding" and isinstance(args[0], Tensor):
                use.ids = args[0].reshape(batch, -1)
        several = {idx for _, idx in entry.params if self._n_uses(idx) > 1}
        x_hat = self._unit_output(entry, use, args) if entry.kind == "affine_norm" else None
        if entry.kind == "func":
            dense = bool(several)
            for name, g in self._func(entry, use, args, delta, dense).items():
                idx = entry.names[name]
                self._add(use, idx, Flat(g) if dense else None, g if not dense else None)
            use.done = True
            return
        for name, factor in self._factors(entry, use, args, delta, x_hat).items():
            idx = entry.names[name]
            if idx in several or not isinstance(factor, LowRank):
                self._add(use, idx, factor, None)
            else:  # one use (the usual case): the norm only, nothing kept
                self._add(use, idx, None, sq_norm(factor, self._n_rows(entry, name)))
        use.done = True

    def _factors(
        self,
        entry: _Entry,
        use: _Use,
        args: tuple[Any, ...],
        delta: Tensor,
        unit_output: Tensor | None = None,
    ) -> dict[str, Factor]:
        """Each parameter's per-example gradient of this use, factored (``_factors``)."""
        m = entry.module
        names = entry.names
        out: dict[str, Factor] = {}
        if entry.kind == "bare":  # the parameter's own per-example gradients
            ((name, _),) = entry.params
            out[name] = Flat(wide(delta).reshape(delta.shape[0], -1))
            return out
        x = args[0]
        if entry.kind in ("linear", "conv1d_hf", "conv"):
            if entry.kind == "conv":
                conv: nn.Conv1d | nn.Conv2d = m  # type: ignore[assignment]
                xs, ds = _conv_unfold(conv, x, delta)
            else:
                d_in = int(x.shape[-1])
                xs, ds = _as_btd(x, d_in), _as_btd(delta, int(delta.shape[-1]))
            # Linear and conv weights are (out, in); Conv1D's is (in, out)
            a, b = (xs, ds) if entry.kind == "conv1d_hf" else (ds, xs)
            if "weight" in names:
                out["weight"] = LowRank(b=b, a=a)
            if "bias" in names:
                out["bias"] = Flat(ds.sum(1))
        elif entry.kind == "embedding":
            emb: nn.Embedding = m  # type: ignore[assignment]
            ids = use.ids
            assert ids is not None
            ds = _as_btd(delta, emb.embedding_dim)
            if emb.padding_idx is not None:
                ds = ds * (ids != emb.padding_idx).unsqueeze(-1)
            out["weight"] = LowRank(b=ds, ids=ids)
        elif entry.kind in ("layernorm", "rmsnorm", "affine_norm"):
            if entry.kind == "affine_norm":  # a model's own class: x_hat from _unit_output
                assert unit_output is not None
                d = int(unit_output.shape[-1])
                x_hat = _as_btd(unit_output, d)
            else:
                norm: nn.LayerNorm | nn.RMSNorm = m  # type: ignore[assignment]
                d = math.prod(tuple(norm.normalized_shape))
                eps = norm.eps if norm.eps is not None else torch.finfo(x.dtype).eps
                x_hat = _normalized(_as_btd(x, d), entry.kind == "layernorm", eps)
            ds = _as_btd(delta, d)
            # per-example grads: weight sum_t delta_t * x_hat_t, bias sum_t delta_t
            if "weight" in names:
                out["weight"] = Flat((ds * x_hat).sum(1))
            if "bias" in names:
                out["bias"] = Flat(ds.sum(1))
        return out

    def _unit_output(self, entry: _Entry, use: _Use, args: tuple[Any, ...]) -> Tensor | None:
        """x_hat of a model's own norm class: its output at weight 1 and bias 0. At its first
        use the layer is checked to compute ``weight * x_hat + bias`` (one that does not, such
        as Gemma's ``(1 + weight) * x_hat``, falls back to torch.func from then on), and x_hat
        is matched against layer and RMS normalization at the usual epsilons: a match is
        computed directly from then on, anything else by one forward of the layer."""
        x = args[0]
        if entry.formula is not None:
            return _normalized(wide(x), *entry.formula)
        module = entry.module
        own = {name: getattr(module, name).detach() for name, _ in entry.params}
        unit = {name: torch.ones_like(p) if name == "weight" else torch.zeros_like(p)
                for name, p in own.items()}  # fmt: skip

        def call(params: dict[str, Tensor], inputs: tuple[Any, ...] = args) -> Tensor:
            out = torch.func.functional_call(module, params, inputs, use.kwargs, strict=False)
            assert isinstance(out, Tensor)
            return out

        self._recomputing = True
        try:
            with torch.no_grad():
                if not entry.checked:  # on two examples: the layer's form, not its data
                    entry.checked = True
                    few = tuple(a[:2] if isinstance(a, Tensor) and a.dim() else a for a in args)
                    unit_few = call(unit, few)
                    zero = call({name: torch.zeros_like(p) for name, p in own.items()}, few)
                    expected = own["weight"] * unit_few + own.get("bias", 0.0)
                    affine = bool(zero.abs().max() == 0) and _close(call(own, few), expected)
                    if not affine:
                        entry.kind = "func"
                        return None
                    entry.formula = _formula(module, wide(few[0]), wide(unit_few))
                    if entry.formula is not None:
                        return _normalized(wide(x), *entry.formula)
                return call(unit)
        finally:
            self._recomputing = False

    def _func(
        self, entry: _Entry, use: _Use, args: tuple[Any, ...], delta: Tensor, dense: bool
    ) -> dict[str, Tensor]:
        """Per-example gradients (``dense``) or their squared norms of the module's own
        parameters via vmap(vjp) (torch.func)."""
        module = entry.module
        kwargs = use.kwargs
        own = {name: getattr(module, name).detach() for name, _ in entry.params}
        tensor_pos = [i for i, a in enumerate(args) if isinstance(a, Tensor) and a.dim() > 0]
        batched = tuple(args[i] for i in tensor_pos)
        n = int(delta.shape[0])
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
                first = out[0] if isinstance(out, tuple) else out
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
        self._recomputing = True
        try:
            with torch.enable_grad():
                if not entry.loop:
                    try:
                        result = torch.func.vmap(per_example, in_dims=in_dims, randomness="same")(
                            own, batched, keyed, delta
                        )
                    except RuntimeError:
                        # modules vmap cannot batch (nn.LSTM's in-place state updates): the
                        # same vjp, one example at a time, from now on
                        entry.loop = True
                if entry.loop:
                    rows = []
                    for i in range(int(delta.shape[0])):
                        xs = batched if use.batch_less else tuple(a[i] for a in batched)
                        rows.append(per_example(own, xs, tuple(k[i] for k in keyed), delta[i]))
                    result = torch.stack(rows)
        finally:
            self._recomputing = False
        if not dense:
            return {name: result[:, j] for j, name in enumerate(own)}
        out, start = {}, 0
        for name, p in own.items():
            out[name] = result[:, start : start + p.numel()]
            start += p.numel()
        return out

    def _n_uses(self, idx: int) -> int:
        return sum(len(self._uses.get(id(e), ())) for e in self._owners[idx])

    def _n_rows(self, entry: _Entry, name: str) -> int:
        return int(getattr(entry.module, name).shape[0])

    def _add(self, use: _Use, idx: int, factor: Factor | None, sq: Tensor | None) -> None:
        """Add one use's contribution to parameter ``idx``'s per-example squared norms: its
        own, plus twice its inner product with each earlier use of the same parameter."""
        if factor is not None:
            n_rows = self._n_rows(use.entry, _name_of(use.entry, idx))
            sq = sq_norm(factor, n_rows)
            pending = []
            for entry in self._owners[idx]:
                for other in self._uses.get(id(entry), ()):
                    if other is use:
                        continue
                    if other.done:
                        sq = sq + 2.0 * inner(other.factors[idx], factor, use.serial, n_rows)
                    else:
                        pending.append(other)
            if isinstance(factor, LowRank) and factor.a is not None and pending:
                # rows Grams against later embedding uses now: the head's (B, T, V) output
                # gradient need not outlive this hook
                for other in pending:
                    if other.ids is not None:
                        factor.gathered[other.serial] = gather_for(factor, other.ids)
                if all(other.ids is not None for other in pending):
                    factor.a = None
            use.factors[idx] = factor
        assert sq is not None
        prev = self._results.get(idx)
        self._results[idx] = sq if prev is None else prev + sq
        if self._batch is None:
            self._batch = int(sq.shape[0])

    # --- the step's result --------------------------------------------------------------

    @property
    def captured(self) -> bool:
        """Whether the last backward gave any per-example norm."""
        return self._batch is not None

    def take(self, device: torch.device) -> Tensor:
        """Per-parameter per-example squared norms of the last backward, shape (n_params, B)."""
        if self._unsupported is not None:
            reason, retry = self._unsupported, self._retry
            self.reset()
            raise Unsupported(reason, retry)
        if self._batch is None:
            raise RuntimeError(
                "no per-example gradients were captured: run the forward pass and "
                "loss.backward() (with grad enabled) before probe.micro_step()/step()"
            )
        batch = self._batch
        self.last_full_batch = self._batch_size or batch
        zero = torch.zeros(batch, device=device, dtype=torch.float32)
        rows = [self._results.get(i, zero) for i in range(self.n_params)]
        if any(r.device != device or r.dtype != torch.float32 for r in rows):
            rows = [r.to(device, torch.float32) for r in rows]
        self.reset()
        return torch.stack(rows)

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
        small = per_param.new_zeros(n_slots, per_param.shape[1]).index_add_(0, slot, per_param)
        if counts is not None:
            if counts.shape[0] != n_full:
                raise ValueError(
                    f"item_counts has {counts.shape[0]} entries but the batch has {n_full} examples"
                )
            counts = counts[: small.shape[1]]
        return small, counts, n_full


def _name_of(entry: _Entry, idx: int) -> str:
    """The attribute name under which ``entry`` owns parameter ``idx``."""
    return next(name for name, i in entry.params if i == idx)


def _close(a: Tensor, b: Tensor) -> bool:
    return torch.allclose(a, b, rtol=1e-4, atol=1e-6 * float(a.abs().max()))


def _normalized(x: Tensor, centred: bool, eps: float) -> Tensor:
    """x_hat over the last dimension: layer normalization (``centred``) or RMS."""
    if centred:
        # a unit weight gives the same x_hat, by a faster kernel than weight=None on CPU
        d = int(x.shape[-1])
        return F.layer_norm(x, (d,), x.new_ones(d), None, eps)
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)


def _formula(module: nn.Module, x: Tensor, x_hat: Tensor) -> tuple[bool, float] | None:
    """Which normalization a model's norm class computes, if a usual one: (centred, eps)."""
    named = [getattr(module, a, None) for a in ("eps", "variance_epsilon", "epsilon")]
    candidates = [e for e in named if isinstance(e, float)] + [1e-5, 1e-6, 1e-12, 1e-8]
    # the first as close as the layer's own precision allows (its own epsilon is tried first)
    tolerance = 50 * torch.finfo(x_hat.dtype).eps * (float(x_hat.abs().max()) or 1.0)
    for eps in candidates:
        for centred in (True, False):
            if float((_normalized(x, centred, eps) - x_hat).abs().max()) <= tolerance:
                return centred, eps
    return None


def _routed_rows(x: Tensor, batch: int) -> Tensor | None:
    """The example of each row of ``x`` when its rows were picked out of a batch-first tensor
    (``h[mask]``, ``h[b_idx, t_idx]``: an expert's tokens) or flattened out of it
    (``h.reshape(-1, d)``: OPT's tokens), found in the autograd graph: the nearest such indexing
    or view of a (batch, ...) tensor giving exactly ``x``'s number of rows, behind at most a few
    row-wise ops. None when there is none: then the rows are not known."""
    n = int(x.shape[0]) if x.dim() else -1
    frontier = [x.grad_fn] if x.grad_fn is not None else []
    for _ in range(6):
        later = []
        for fn in frontier:
            kind = type(fn).__name__
            if kind in ("ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0"):
                # (B, T, ..., d) -> (B T ..., d): OPT's norms and MLP on flattened tokens
                sizes = tuple(getattr(fn, "_saved_self_sym_sizes", ()))
                leading = [math.prod(sizes[:k]) for k in range(2, len(sizes))]
                if sizes and sizes[0] == batch and n in leading:
                    return torch.arange(n, device=x.device) // (n // batch)
            if kind == "IndexBackward0":
                # the saved inputs of torch's IndexBackward0 node (not in its type stubs)
                sizes = tuple(getattr(fn, "_saved_self_sym_sizes", ()))
                indices = getattr(fn, "_saved_indices", ())
                first = indices[0] if indices else None
                if sizes and sizes[0] == batch and isinstance(first, Tensor):
                    if first.dtype == torch.bool and tuple(first.shape) == sizes[: first.dim()]:
                        rows = first.nonzero()[:, 0]
                    elif not first.is_floating_point() and first.dim() == 1:
                        rows = first
                    else:
                        rows = None
                    if rows is not None and int(rows.shape[0]) == n:
                        return rows
            later += [nxt for nxt, _ in fn.next_functions if nxt is not None]
        frontier = later
    return None


def _by_example(
    rows: Tensor, batch: int, args: tuple[Any, ...], kwargs: dict[str, Any], delta: Tensor
) -> tuple[tuple[Any, ...], dict[str, Any], Tensor]:
    """Rows of a routed layer regrouped per example: (B, most rows of an example, ...), zero
    rows padding the rest (a zero row adds nothing to a row-wise layer's gradient)."""
    order = torch.argsort(rows, stable=True)
    counts = torch.bincount(rows, minlength=batch)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.empty_like(rows)
    slot[order] = torch.arange(rows.shape[0], device=rows.device) - starts[rows[order]]
    width = int(counts.max()) if rows.numel() else 1

    def place(t: Tensor) -> Tensor:
        out = t.new_zeros(batch, width, *t.shape[1:])
        out[rows, slot] = t
        return out

    n = int(rows.shape[0])

    def maybe(a: Any) -> Any:
        return place(a) if isinstance(a, Tensor) and a.dim() and a.shape[0] == n else a

    return tuple(maybe(a) for a in args), {k: maybe(v) for k, v in kwargs.items()}, place(delta)


def _head(t: Any, keep: int | None, batch: int) -> Any:
    if not isinstance(t, Tensor):
        return t
    t = t.detach()
    return t[:keep] if keep is not None and t.dim() and t.shape[0] == batch else t


def _as_btd(t: Tensor, d: int) -> Tensor:
    return wide(t.reshape(t.shape[0], -1, d))


def _conv_unfold(conv: nn.Conv1d | nn.Conv2d, x: Tensor, delta: Tensor) -> tuple[Tensor, Tensor]:
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
