"""Uses of a parameter outside its own module's forward, followed during the model's forward.

The per-example hooks sit on modules: a parameter counts through the calls of the module that
owns it. Models also use parameters directly: ``nn.MultiheadAttention`` hands ``out_proj.weight``
to ``F.multi_head_attention_forward``, a language model's head is ``F.linear(h,
self.tok_emb.weight)``, Mamba's mixer reads ``self.conv1d.weight``. Such a use is invisible to
the module hooks, and |G_small|^2 would miss it while |G_big|^2 (from ``.grad``) has it.

``FollowUses`` is a ``TorchFunctionMode`` active during the forward of a measured step: it
sees every torch op, and for each op taking a measured parameter (or a cast or transpose of
one) whose output carries a gradient, asks whether a hooked module that accounts for that
parameter is running (its ``Entry.active``). A use that none accounts for is

- a linear use (``F.linear``, ``matmul``/``@`` on either side) of batch-first activations: its
  per-example gradient is sum_t delta_t x_t^T, recorded like a Linear layer's (``linear``);
- anything else: handed to ``other``, which moves the parameter to torch.func over the
  smallest enclosing module from the next step (this step is not measured, said once).

No host read, nothing on the device: the check runs on every measured step at the cost of a
Python call per op of the forward.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from torch import Tensor
from torch.overrides import TorchFunctionMode

from ._broadcast import BROADCASTING as _BROADCASTING

#: ops that pass a parameter on unchanged in value (casts, copies) or transposed (2-d)
_CASTS = frozenset({"to", "float", "double", "half", "bfloat16", "type_as", "contiguous", "clone"})
_TRANSPOSES = frozenset({"t", "T", "mT", "transpose", "swapaxes"})
#: not any argument (``dict.get``'s default None would match a None argument)
_NONE = object()
_MATMULS = frozenset({"matmul", "__matmul__", "__rmatmul__", "mm", "bmm"})


class Host(Protocol):
    """What the mode reports to (``PerExampleNorms``)."""

    def accounted(self, idx: int) -> bool: ...

    def linear(
        self, idx: int, form: str, x: Tensor, out: Tensor, swap: bool, bias: int | None
    ) -> bool: ...

    def other(self, idx: int, op: str) -> None: ...

    def broadcast(self, idx: int, value: Tensor, others: list[Tensor]) -> Tensor | None: ...


class _Derived:
    """A cast or transpose of a parameter, made outside its module: (index, transposed)."""

    __slots__ = ("idx", "tensor", "transposed")

    def __init__(self, idx: int, transposed: bool, tensor: Tensor) -> None:
        self.idx, self.transposed, self.tensor = idx, transposed, tensor


def _name(func: Callable[..., Any]) -> str:
    owner = getattr(func, "__self__", None)  # a property's getter: Tensor.T.__get__
    if getattr(func, "__name__", "") == "__get__" and owner is not None:
        return str(getattr(owner, "__name__", ""))
    return str(getattr(func, "__name__", ""))


def _grad_carrying(out: Any) -> bool:
    if isinstance(out, Tensor):
        return out.requires_grad
    if isinstance(out, (tuple, list)):
        return any(isinstance(o, Tensor) and o.requires_grad for o in out)
    return False


class FollowUses(TorchFunctionMode):
    """Active during a measured forward: reports every use of a measured parameter that no
    running hooked module accounts for (see the module's docstring)."""

    def __init__(self, host: Host, index: dict[int, int]) -> None:
        super().__init__()
        self.host = host
        self.index = index  # id(parameter) -> its global index
        self.derived: dict[int, _Derived] = {}  # id(tensor) -> what it was made from
        self.depth = 0  # nested forwards of the model
        self.seen: set[int] = set()  # parameters used in the forwards of this step
        self.ran = False  # a forward of the model ran under the mode this step
        #: the forward's tensors computed from the batch, by id (weakly held: a freed tensor's
        #: id, reused by another, must not count)
        self.batchy: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()

    def begin(self) -> None:
        self.ran = True
        if self.depth == 0:
            self.__enter__()  # type: ignore[no-untyped-call]
        self.depth += 1

    def end(self) -> None:
        if self.depth == 0:
            return
        self.depth -= 1
        if self.depth == 0:
            self.__exit__(None, None, None)  # type: ignore[no-untyped-call]
            self.derived.clear()
            self.batchy.clear()

    def mark(self, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        """The model's own inputs: the batch's data."""
        for a in (*args, *kwargs.values()):
            for t in a if isinstance(a, (list, tuple)) else (a,):
                if isinstance(t, Tensor):
                    self.batchy[id(t)] = t

    def batch_free(self, t: Tensor) -> bool:
        """Whether ``t``, met during a followed forward, was computed without the batch's data
        (positions from ``arange``, T5's relative position buckets): not batch-first, whatever
        its first dimension."""
        if t.dim() and t.stride(0) == 0:
            return False  # expanded over its first dimension (BERT's token type buffer): rows
            # that are the same for every example are each example's own
        return self.depth > 0 and self.batchy.get(id(t), _NONE) is not t

    def _spread(self, args: Sequence[Any], kwargs: dict[str, Any], out: Any) -> None:
        """An op's outputs carry the batch's data if any of its inputs does."""
        if not isinstance(out, (Tensor, list, tuple)):
            return  # a shape, a dtype, a device: nothing to record
        batchy = self.batchy
        for a in (*args, *kwargs.values()) if kwargs else args:
            if batchy.get(id(a), _NONE) is a:
                break
            if type(a) in (list, tuple) and any(batchy.get(id(b), _NONE) is b for b in a):
                break
        else:
            return
        if isinstance(out, Tensor):
            batchy[id(out)] = out
        elif isinstance(out, (list, tuple)):
            for o in out:
                if isinstance(o, Tensor):
                    batchy[id(o)] = o

    def _touches(self, args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
        index, derived = self.index, self.derived
        for a in (*args, *kwargs.values()) if kwargs else args:
            if id(a) in index or (derived and id(a) in derived):
                return True
            if type(a) in (list, tuple) and any(id(b) in index for b in a):
                return True
        return False

    def _find(
        self, args: Sequence[Any], kwargs: dict[str, Any]
    ) -> tuple[list[tuple[int, Any]], list[int]]:
        """(index, slot) of each parameter-derived argument no running module accounts for;
        the indices of every measured parameter among the arguments."""
        found: list[tuple[int, Any]] = []
        present: list[int] = []
        index, derived = self.index, self.derived
        for slot, a in (*enumerate(args), *kwargs.items()):
            if isinstance(a, Tensor):
                idx = index.get(id(a))
                if idx is None:
                    d = derived.get(id(a))
                    if d is not None and d.tensor is a:
                        found.append((d.idx, slot))
                else:
                    present.append(idx)
                    if not self.host.accounted(idx):
                        found.append((idx, slot))
            elif isinstance(a, (list, tuple)):  # torch.cat([...]), an RNN's flat weights
                for b in a:
                    if isinstance(b, Tensor) and id(b) in index:
                        idx = index[id(b)]
                        present.append(idx)
                        if not self.host.accounted(idx):
                            found.append((idx, slot))
        return found, present

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: tuple[type, ...],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if not self._touches(args, kwargs):
            out = func(*args, **kwargs)  # most ops: no measured parameter among the arguments
            self._spread(args, kwargs, out)
            return out
        found, present = self._find(args, kwargs)
        elementwise = len(found) == 1 and isinstance(found[0][1], int)
        if elementwise and _name(func) in _BROADCASTING and not self._transposed(args[found[0][1]]):
            # an elementwise op broadcasting the parameter over the batch: its expanded copy's
            # gradient holds each example's (as for a container's own parameters)
            idx, slot = found[0]
            others = [a for i, a in enumerate(args) if i != slot and isinstance(a, Tensor)]
            expanded = self.host.broadcast(idx, args[slot], others)
            if expanded is not None:
                args = (*args[:slot], expanded, *args[slot + 1 :])
                found = []
        out = func(*args, **kwargs)
        self._spread(args, kwargs, out)
        if not _grad_carrying(out):
            return out  # shapes, dtypes, .grad, detached copies: nothing flows back
        self.seen.update(present)
        if found:
            self._follow(_name(func), found, args, kwargs, out)
        return out

    def _follow(
        self,
        name: str,
        found: list[tuple[int, Any]],
        args: Sequence[Any],
        kwargs: dict[str, Any],
        out: Any,
    ) -> None:
        if len(found) == 1 and isinstance(out, Tensor):
            idx, slot = found[0]
            if slot == 0 and name in _CASTS | _TRANSPOSES:
                d = self.derived.get(id(args[0]))
                transposed = d.transposed if d is not None and d.tensor is args[0] else False
                if name in _TRANSPOSES:
                    if args[0].dim() != 2:
                        self.host.other(idx, name)
                        return
                    transposed = not transposed
                self.derived[id(out)] = _Derived(idx, transposed, out)
                return
        if isinstance(out, Tensor) and self._linear(name, found, args, kwargs, out):
            return
        for idx, _ in found:
            self.host.other(idx, name)

    def _linear(
        self,
        name: str,
        found: list[tuple[int, Any]],
        args: Sequence[Any],
        kwargs: dict[str, Any],
        out: Tensor,
    ) -> bool:
        """A linear use of batch-first activations: recorded by the host's Linear identity."""
        slots = {slot: idx for idx, slot in found}
        if name == "linear":
            x = args[0] if args else kwargs.get("input")
            w_slot: int | str = 1 if len(args) > 1 else "weight"
            b_slot: int | str = 2 if len(args) > 2 else "bias"
            if not isinstance(x, Tensor) or w_slot not in slots or set(slots) - {w_slot, b_slot}:
                return False
            w = args[1] if w_slot == 1 else kwargs["weight"]
            form = "conv1d_hf" if self._transposed(w) else "linear"
            return self.host.linear(slots[w_slot], form, x, out, False, slots.get(b_slot))
        if name in _MATMULS and len(args) == 2 and len(slots) == 1:
            ((slot, idx),) = slots.items()
            if not isinstance(slot, int):
                return False
            w, x = args[slot], args[1 - slot]
            if not isinstance(x, Tensor) or w.dim() != 2:
                return False
            transposed = self._transposed(w)
            if (slot == 1) != (name == "__rmatmul__"):  # x @ W: W is (in, out)
                form = "linear" if transposed else "conv1d_hf"
                return self.host.linear(idx, form, x, out, False, None)
            # W @ x, x (B, in, L): the same identity on transposed activations
            form = "conv1d_hf" if transposed else "linear"
            return self.host.linear(idx, form, x, out, True, None)
        return False

    def _transposed(self, w: Tensor) -> bool:
        d = self.derived.get(id(w))
        return d is not None and d.tensor is w and d.transposed
