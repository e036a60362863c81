"""Per-example squared gradient norms without per-example gradients (B_small = 1).

Each module owning measured parameters gets a forward hook. At every call (a *use*) it saves
the module's input and reads the output gradient delta = dL/dy from a tensor hook on the
output; the backward then gives each parameter's per-example squared norms from the layer
rules of ``_layers`` (Linear and Conv: Gram forms; Embedding: a segment sum; norm layers: (B, D)
per-example gradients). Any other module, a parametrized one (``weight_norm``,
``spectral_norm``, ``parametrize``) and a layer whose rule fails fall back to ``torch.func``
over the module alone (``_fallback``). What real models do on top of that (docs/science.md):

- a parameter with several uses (a tied embedding and head, an encoder-decoder's shared
  embedding, a module called twice) gets the cross terms between its uses (``_factors.inner``);
- a batch-less output (positions ``arange(T)`` broadcast over the batch, BERT's position
  buffers, T5's relative attention bias, a norm over a position table) is followed to its
  broadcast (``_broadcast``);
- a parameter used outside its own module's forward (``F.linear(h, self.tok_emb.weight)``,
  ``nn.MultiheadAttention``'s ``out_proj``) is followed by ``_functional``;
- gradient checkpointing's recomputed forwards are not counted twice.

Completeness: a parameter that got a gradient in the backward with none of its uses recorded
is never filled with zeros, nor is a use that cannot be followed: the step is reported as
``Unsupported`` with the reason, and the probe decides what to do. Batch is dimension 0 of
each module's first input and output.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize
from torch.utils.hooks import RemovableHandle

from ._broadcast import Capture
from ._factors import Factor, Flat, LowRank, gather_for, inner, sq_norm
from ._fallback import func_grads, unit_output
from ._functional import FollowUses
from ._instrument import Wrap, _identity
from ._layers import RULES, supported_kind, unsupported_reason
from ._outside import OutsideUses, in_parametrization
from ._uses import (
    Entry,
    Unsupported,
    Use,
    by_example,
    first_tensor,
    head,
    in_backward,
    tensor_at,
)

PerExampleMethod = Literal["auto", "identities", "func"]

__all__ = ["PerExampleMethod", "PerExampleNorms", "Unsupported"]


def _own_parameters(module: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    """The parameters a module's forward accounts for: its own, and the originals of its
    parametrizations (``parametrizations.weight.original0``), whose per-example gradients
    torch.func takes through the parametrization."""
    yield from module.named_parameters(recurse=False)
    if parametrize.is_parametrized(module):
        plists: nn.ModuleDict = module.parametrizations  # type: ignore[assignment]
        for tensor_name, plist in plists.items():
            for name, p in plist.named_parameters(recurse=False):
                yield f"parametrizations.{tensor_name}.{name}", p


def _has_parametrised_children(module: nn.Module) -> bool:
    """A container whose own parameters are used between its children's calls (a leaf with an
    activation module, like Mixtral's experts, is recomputed whole by torch.func instead).
    torch's own modules with children (``nn.MultiheadAttention``, whose ``out_proj`` is used
    through ``F.multi_head_attention_forward``) are leaves: torch.func over the whole module."""
    if type(module).__module__.startswith("torch.nn.modules"):
        return False
    return any(
        any(True for _ in child.parameters())
        for name, child in module.named_children()
        if name != "parametrizations"
    )


class PerExampleNorms(OutsideUses):
    """Hooks that compute, per backward, each parameter's per-example squared gradient norms.
    ``follow``: follow uses outside their modules (``_functional``) and check that every
    parameter with a gradient was accounted for (off for sharded and compiled models)."""

    def __init__(
        self,
        model: nn.Module,
        param_index: dict[int, int],
        method: PerExampleMethod = "auto",
        max_examples: int | None = None,
        wrap: Wrap = _identity,
        follow: bool = True,
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
        self.model = model
        self.n_params = len(param_index)
        self.max_examples = max_examples
        self.armed = False
        # called with an error raised while computing norms (instead of raising it inside the
        # user's forward or backward); None: raise
        self.on_error: Callable[[BaseException], None] | None = None
        self._recomputing = False
        self.last_full_batch = 0  # examples in the batch behind the last take()
        self._handles: list[RemovableHandle] = []
        self.entries: list[Entry] = []
        self._owners: dict[int, list[Entry]] = {}  # parameter index -> modules accounting for it
        self._batch_hint: int | None = None  # from the model's own input
        self._root_ids_ndim: int | None = None  # ndim of the model's input ids, if any
        self._captures: list[Capture] = []  # on parameters: their hooks end with the step
        self._names: dict[int, str] = {}  # parameter index -> its name in the model
        self._active: dict[int, int] = {}  # id(module) -> its forwards under way
        self._functional: dict[tuple[int, str, int | None], Entry] = {}  # linear uses' entries
        self._moved: set[int] = set()  # parameters moved to an enclosing module's torch.func
        #: uses outside their modules followed by torch.func over an enclosing module (docs)
        self.followed: list[str] = []
        self.reset()
        self._handles.append(
            model.register_forward_pre_hook(wrap(self._see_input, False), with_kwargs=True)
        )
        for name, p in model.named_parameters(remove_duplicate=False):
            if id(p) in param_index:
                self._names.setdefault(param_index[id(p)], name)
        self._follow: FollowUses | None = None
        if follow:
            self._follow = FollowUses(self, param_index)
            self._handles.append(
                model.register_forward_hook(wrap(self._end_forward, False), always_call=True)
            )
            for p in {id(p): p for p in model.parameters() if id(p) in param_index}.values():
                self._handles.append(p.register_hook(self._graded_hook(param_index[id(p)])))
        if follow:
            # a module called with no forward hook skips its hooks altogether: one on each
            # module holding parameters lets torch.func over it (``other``) see the call under
            # way where a use outside a module is met
            for mod_name, module in model.named_modules():
                holds = any(True for _ in module.parameters())
                if holds and not in_parametrization(mod_name):
                    self._handles.append(module.register_forward_hook(_nothing))
        for mod_name, module in model.named_modules():
            if in_parametrization(mod_name):
                continue
            own = _own_parameters(module)
            direct = [(n, param_index[id(p)]) for n, p in own if id(p) in param_index]
            if not direct:
                continue
            label = mod_name or "(model)"
            kind = supported_kind(module) if method != "func" else None
            if kind is None and method == "identities":
                raise ValueError(
                    f"module {label} ({type(module).__name__}) has no cheap per-example "
                    "identity; use per_example='auto' to fall back to torch.func"
                )
            if kind is None and method == "auto" and _has_parametrised_children(module):
                # a container's own parameters (a position table, a cls token, a layer
                # scale), used in its forward between its children: followed to the batch
                entries = [Entry(module, label, [one], "bare") for one in direct]
                self._handles += self._bare_hooks(module, entries)
            else:
                entries = [Entry(module, label, direct, kind or "func")]
            for entry in entries:
                self._hook(entry)

    def _hook(self, entry: Entry) -> None:
        """Record ``entry``'s uses from now on, and (following uses) while its module runs."""
        module = entry.module
        for _, idx in entry.params:
            self._owners.setdefault(idx, []).append(entry)
        self.entries.append(entry)
        self._handles.append(
            module.register_forward_hook(
                self._wrap(self._make_forward_hook(entry), False), with_kwargs=True
            )
        )
        if self._follow is not None and id(module) not in self._active:
            self._active[id(module)] = 0
            self._handles += [
                module.register_forward_pre_hook(self._enter(module), prepend=True),
                module.register_forward_hook(self._leave(module), always_call=True),
            ]

    def _enter(self, module: nn.Module) -> Callable[..., None]:
        def pre(*_: Any) -> None:
            self._active[id(module)] += 1

        return pre

    def _leave(self, module: nn.Module) -> Callable[..., None]:
        def post(*_: Any) -> None:
            self._active[id(module)] = max(0, self._active[id(module)] - 1)

        return post

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
        if self._follow is not None:
            self._follow.end()
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def reset(self) -> None:
        for capture in self._captures:
            capture.close()
        self._captures.clear()
        self._results: dict[int, Tensor] = {}
        self._uses: dict[int, list[Use]] = {}  # id(entry) -> this step's uses
        self._graded: set[int] = set()  # parameters that got a gradient this backward
        #: used where the forward's op-follower does not see them: in a forward recomputed in
        #: the backward, or through a container's swapped-in view (``_capture``)
        self._recomputed: set[int] = set()
        if getattr(self, "_follow", None) is not None:
            self._follow.seen.clear()  # type: ignore[union-attr]
            self._follow.ran = False  # type: ignore[union-attr]
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

    def _new_use(self, entry: Entry, kwargs: dict[str, Any]) -> Use:
        """A call of ``entry``'s module this step, numbered (cross terms are keyed by it)."""
        self._serial += 1
        return Use(self._serial, entry, (), kwargs)

    @contextlib.contextmanager
    def _recompute(self) -> Iterator[None]:
        """The probe runs a module again (torch.func): its own hooks stay quiet meanwhile."""
        self._recomputing = True
        try:
            yield
        finally:
            self._recomputing = False

    # --- the forward --------------------------------------------------------------------

    def _see_input(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """The model's own input: the batch size, before any layer is called; the following
        of uses starts (``_functional``)."""
        if in_backward():
            return
        first = first_tensor(args, kwargs)
        if first is not None:
            self._batch_hint = int(first.shape[0])
            is_ids = not first.is_floating_point() and not first.is_complex()
            self._root_ids_ndim = first.dim() if is_ids else None
        quiet = not self.armed or self._recomputing or not torch.is_grad_enabled()
        if self._follow is not None and not quiet and not torch.compiler.is_compiling():
            self._follow.begin()
            self._follow.mark(args, kwargs)

    def _end_forward(self, *_: Any) -> None:
        if self._follow is not None:
            self._follow.end()

    def _graded_hook(self, idx: int) -> Callable[[Tensor], None]:
        def hook(grad: Tensor) -> None:
            if self.armed and not self._recomputing:
                self._graded.add(idx)

        return hook

    def _cannot(self, entry: Entry, why: str, retry: bool = False) -> None:
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

    def _backward(self, use: Use, delta: Tensor, keep: int | None) -> None:
        if not self.armed:  # stopped after an error earlier in this backward
            return
        try:
            self._measure(use, head(delta.detach(), keep, int(delta.shape[0])))
        except Exception as exc:
            self._error(exc)

    def _measure(self, use: Use, delta: Tensor) -> None:
        entry = use.entry
        args = use.args
        if use.rows is not None:  # routed rows -> (B, rows of each example, ...), zero-padded
            n_batch = self._batch_size or 0
            args, kwargs, delta = by_example(use.rows, n_batch, args, use.kwargs, delta)
            keep = self._keep(n_batch)
            args = tuple(head(a, keep, n_batch) for a in args)
            use.kwargs = {k: head(v, keep, n_batch) for k, v in kwargs.items()}
            delta = head(delta, keep, n_batch)
        if use.swap:  # ``W @ x``: the Linear identity on transposed activations
            delta = delta.transpose(-1, -2)
        batch = int(delta.shape[0])
        if use.batch_less:  # the same input for every example: (B, *shape)
            args = tuple(
                a.unsqueeze(0).expand(batch, *a.shape) if isinstance(a, Tensor) and a.dim() else a
                for a in args
            )
            if entry.kind == "embedding" and isinstance(args[0], Tensor):
                use.ids = args[0].reshape(batch, -1)
        several = {idx for _, idx in entry.params if self._n_uses(idx) > 1}
        factors: dict[str, Factor] | None = None
        if entry.kind != "func":
            try:
                x_hat = None
                if entry.kind == "affine_norm":
                    x_hat = unit_output(entry, use, args, self._recompute)
                if entry.kind != "func":
                    factors = RULES[entry.kind](entry, use, args, delta, x_hat)
            except Exception as exc:
                if entry.label.startswith("F."):  # a functional use: no module to fall back to
                    self._cannot(entry, f"its identity failed ({type(exc).__name__}: {exc})")
                    return
                entry.kind = "func"  # the layer's identity failed: torch.func from now on
        if factors is None:
            dense = bool(several)
            try:
                grads = func_grads(entry, use, args, delta, dense, self._recompute)
            except Exception as exc:  # this step is lost, never the run (auto: micro-batches)
                self._cannot(entry, f"torch.func failed on it ({type(exc).__name__}: {exc})")
                return
            for name, g in grads.items():
                idx = entry.names[name]
                self._add(use, idx, Flat(g) if dense else None, g if not dense else None)
            use.done = True
            return
        for name, factor in factors.items():
            if name not in entry.names:
                continue  # given up to an enclosing module's torch.func (``other``)
            idx = entry.names[name]
            if idx in several or not isinstance(factor, LowRank):
                self._add(use, idx, factor, None)
            else:  # one use (the usual case): the norm only, nothing kept
                self._add(use, idx, None, sq_norm(factor, self._n_rows(entry, name)))
        use.done = True

    def _n_uses(self, idx: int) -> int:
        return sum(len(self._uses.get(id(e), ())) for e in self._owners.get(idx, ()))

    def _n_rows(self, entry: Entry, name: str) -> int:
        return int(tensor_at(entry.module, name).shape[0])

    def _add(self, use: Use, idx: int, factor: Factor | None, sq: Tensor | None) -> None:
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
        """Per-parameter per-example squared norms of the last backward, shape (n_params, B).
        A parameter with no recorded use adds zeros only if it got no gradient either."""
        if self._follow is not None and self._unsupported is None and self._batch is not None:
            # uses seen by the op follower: only if the model's own forward ran under it (a
            # wrapper may call a submodule directly, as Lightning does)
            seen = self._follow.seen | self._recomputed if self._follow.ran else None
            missing = sorted(
                i
                for i in self._graded
                if i not in self._results or (seen is not None and i not in seen)
            )
            if missing:
                names = ", ".join(self._names.get(i, str(i)) for i in missing[:3])
                self._unsupported = (
                    f"parameter(s) {names} got a gradient that the model's forward does not "
                    "account for (used outside it, e.g. in the loss, or where the probe cannot "
                    "see the use)"
                )
                self._retry = False
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


def _name_of(entry: Entry, idx: int) -> str:
    """The name under which ``entry`` accounts for parameter ``idx``."""
    return next(name for name, i in entry.params if i == idx)


def _nothing(*_: Any) -> None:
    """A forward hook that does nothing (see ``PerExampleNorms.__init__``)."""
