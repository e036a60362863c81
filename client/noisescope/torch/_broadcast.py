"""Following a batch-less output to the op that broadcasts it over the batch.

nanoGPT's ``wpe(arange(T))`` gives (T, d), BERT's and GPT-2's position embeddings (1, T, d), T5's
relative attention bias (q, k, heads): one value for all examples, added to batch-first
activations. The module's own output gradient is then already summed over the batch, but
example i's gradient is the gradient of the *broadcast result* at example i (docs/science.md).
The probe hands such an output back to the model as a ``BatchLess`` tensor: same values, same
autograd graph, same shape, so the model's code runs unchanged. Through linear view-like ops
(``to``, ``permute``, ``unsqueeze``, slicing, ...) it stays one; at the first elementwise op that
broadcasts it over the batch it is replaced by its ``expand``-ed copy, whose gradient hook sees
each example's output gradient, and from there on everything is plain tensors. Any other first
use is reported (``on_fail``): the layer's per-example gradients are then unknown, never guessed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

#: elementwise ops whose gradient for a broadcast operand is the per-position one
BROADCASTING = frozenset(
    {
        *("add", "add_", "__add__", "__radd__", "__iadd__"),
        *("sub", "sub_", "__sub__", "__rsub__", "__isub__"),
        *("mul", "mul_", "__mul__", "__rmul__", "__imul__"),
        *("div", "div_", "__truediv__", "__rtruediv__", "__itruediv__"),
        *("where", "masked_fill"),
    }
)
#: deterministic ops a batch-less value may go through before it meets the batch (the other
#: operands batch-less too): undone at the backward by their vjp
_CHAIN = BROADCASTING | frozenset(
    {
        *("to", "contiguous", "clone", "float", "double", "half", "bfloat16", "type_as"),
        *("permute", "transpose", "unsqueeze", "squeeze", "view", "reshape", "flatten"),
        *("__getitem__", "narrow", "expand"),
    }
)


class BatchLess(Tensor):
    """A module's batch-less output (or a value computed from it alone), handed back to the
    model until it meets the batch."""

    _ns_capture: Capture
    _ns_chain: tuple[_Step, ...]  # the ops from the module's output to this value

    @classmethod
    def __torch_function__(
        cls,
        func: Callable[..., Any],
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        mine = [a for a in (*args, *kwargs.values()) if isinstance(a, BatchLess)]
        with torch._C.DisableTorchFunctionSubclass():
            if not mine or mine[0]._ns_capture.failed:
                return func(*args, **kwargs)
            return mine[0]._ns_capture.handle(func, list(args), dict(kwargs))


#: where a BatchLess sits among an op's arguments: a position or a keyword
_Slot = int | str
#: one op of a chain: the function, the slot of the value, the other arguments
_Step = tuple[Callable[..., Any], _Slot, list[Any], dict[str, Any]]


class Capture:
    """One batch-less output: every op that broadcasts it (or a value computed from it alone)
    over the batch gets an expanded copy whose gradient hook collects per-example gradients;
    the output's own gradient hook, which runs after all of them, checks that they add up to
    it (no use went unseen) and hands them on."""

    def __init__(
        self,
        output: Tensor,
        batch: int,
        on_grad: Callable[[Tensor], None],
        on_fail: Callable[[str], None],
        check: bool = True,
    ) -> None:
        self.output = output.detach()
        #: check on the host that the examples' gradients add up to the output's (the first
        #: steps of a layer: the layout does not change from step to step); later on the device
        self.check = check
        self.batch = batch
        self.failed = False
        self._collected: Tensor | None = None
        self._on_grad = on_grad
        self._on_fail = on_fail
        self._handle = output.register_hook(self._finish)

    def close(self) -> None:
        """Remove the output's hook (a parameter's outlives the step otherwise)."""
        self._handle.remove()

    def wrap(self, t: Tensor, chain: tuple[_Step, ...] = ()) -> BatchLess:
        out = t.as_subclass(BatchLess)
        out._ns_capture = self
        out._ns_chain = chain
        return out

    def handle(self, func: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> Any:
        name = getattr(func, "__name__", "")
        slots: list[_Slot] = [i for i, a in enumerate(args) if isinstance(a, BatchLess)]
        slots += [k for k, a in kwargs.items() if isinstance(a, BatchLess)]
        others = [
            a
            for a in (*args, *kwargs.values())
            if isinstance(a, Tensor) and not isinstance(a, BatchLess)
        ]
        if len(slots) == 1:
            slot = slots[0]
            value = _get(args, kwargs, slot)
            chain = value._ns_chain
            plain = value.as_subclass(Tensor)
            target = self._target(name, plain.shape, others)
            if target is not None:
                expanded = plain.expand(target)
                if expanded.requires_grad:
                    expanded.register_hook(lambda g: self._collect(g, chain, plain.shape))
                _put(args, kwargs, slot, expanded)
                return func(*args, **kwargs)
            _put(args, kwargs, slot, plain)
            result = func(*args, **kwargs)
            expands = name in ("expand", "expand_as") and isinstance(result, Tensor)
            if expands and self._over_batch(plain.shape, result.shape):
                # ViT's cls_token.expand(B, -1, -1): the expand is the broadcast itself
                if result.requires_grad:
                    result.register_hook(lambda g: self._collect(g, chain, plain.shape))
                return result
            if not isinstance(result, Tensor) and not (
                isinstance(result, (tuple, list)) and any(isinstance(r, Tensor) for r in result)
            ):
                return result  # shape, dtype, device, dim(), ...: nothing flows on
            alone = all(_lead(o) != self.batch for o in others)
            if isinstance(result, Tensor) and name in _CHAIN and alone:
                # a function of the value alone (the other operands the same for every
                # example): its vjp, taken per example, leads back to the module's output
                _put(args, kwargs, slot, None)
                return self.wrap(result, (*chain, (func, slot, args, kwargs)))
        else:
            result = func(*args, **kwargs)
            if not isinstance(result, Tensor) and not isinstance(result, (tuple, list)):
                return result
        self._fail(f"its output went through {name or func!r} before meeting the batch")
        return result

    def _fail(self, why: str) -> None:
        if not self.failed:
            self.failed = True
            self._on_fail(why)

    def _target(self, name: str, mine: torch.Size, others: list[Tensor]) -> torch.Size | None:
        """The batch-first shape this op broadcasts the value to, if it does so only over the
        batch: the shape to expand it to before the op."""
        shape: torch.Size
        if name in BROADCASTING:
            try:
                shape = torch.Size(torch.broadcast_shapes(mine, *(o.shape for o in others)))
            except RuntimeError:
                return None
        elif others and mine and mine[0] == 1:
            # any other op that takes a (1, ...) value beside batch-first tensors (an attention
            # mask in scaled_dot_product_attention) broadcasts it over the batch
            if not any(_lead(o) == self.batch and o.dim() == len(mine) for o in others):
                return None
            shape = torch.Size((self.batch, *mine[1:]))
        else:
            return None
        return shape if self._over_batch(mine, shape) else None

    def _over_batch(self, mine: torch.Size, shape: torch.Size) -> bool:
        return over_batch(mine, shape, self.batch)

    def _collect(self, grad: Tensor, chain: tuple[_Step, ...], shape: torch.Size) -> None:
        """One broadcast's per-example gradients, taken back to the module's output."""
        if self.failed:
            return
        try:  # a gradient hook: an error here would abort the user's backward
            self._take_back(grad, chain, shape)
        except Exception as exc:
            self._fail(f"taking its gradient back failed ({type(exc).__name__}: {exc})")

    def _take_back(self, grad: Tensor, chain: tuple[_Step, ...], shape: torch.Size) -> None:
        per_position = per_example(grad, shape)
        if chain:

            def through(t: Tensor) -> Tensor:
                for func, slot, step_args, step_kwargs in chain:
                    a, kw = list(step_args), dict(step_kwargs)
                    _put(a, kw, slot, t)
                    t = func(*a, **kw)
                return t

            undo = torch.func.vjp(through, self.output)[1]
            per_position = torch.func.vmap(undo)(per_position)[0]
        prev = self._collected
        self._collected = per_position if prev is None else prev + per_position

    def _finish(self, grad: Tensor) -> None:
        """The output's whole gradient: the broadcasts' per-example gradients must add up to it
        (else some use went unseen)."""
        collected, self._collected = self._collected, None
        if self.failed:
            return
        if collected is None:
            self._fail("its gradient reached it without going through a broadcast over the batch")
            return
        total = collected.sum(0).to(grad.dtype)
        if total.shape != grad.shape:
            self._fail(f"its examples' gradients have shape {tuple(total.shape)}")
            return
        gap = (total - grad).abs().max() > 1e-3 * grad.abs().max()
        if self.check:
            if bool(gap):  # a host read: only while the layout is being checked
                self._fail("part of its gradient reached it other than through a broadcast")
                return
        else:  # no host read in the backward: a gap makes the step's norms NaN (not logged)
            collected = torch.where(gap, torch.full_like(collected, float("nan")), collected)
        self._on_grad(collected)


def over_batch(mine: torch.Size, shape: torch.Size, batch: int) -> bool:
    """Whether broadcasting ``mine`` to ``shape`` copies it once per example (and maybe over
    other dimensions too, as a layer-scale vector over positions): dimension 0 of ``shape`` is
    the batch, and ``mine`` has no dimension there or a 1."""
    if not shape or shape[0] != batch or len(mine) > len(shape):
        return False
    if len(mine) == len(shape) and mine[0] != 1:
        return False
    try:
        return tuple(torch.broadcast_shapes(mine, shape)) == tuple(shape)
    except RuntimeError:
        return False


def per_example(grad: Tensor, mine: torch.Size) -> Tensor:
    """(B, *mine): each example's gradient of a value of shape ``mine`` broadcast to
    ``grad.shape`` (batch first): summed over the other dimensions it was copied along."""
    n, k = grad.dim(), grad.dim() - len(mine)
    if k == 0:  # mine[0] == 1 stands for the batch
        dims = tuple(d for d in range(1, n) if mine[d] == 1 and grad.shape[d] != 1)
        return (grad.sum(dims, keepdim=True) if dims else grad).unsqueeze(1)
    if k > 1:  # dimensions other than the batch's that ``mine`` lacks
        grad = grad.sum(tuple(range(1, k)))
    dims = tuple(j + 1 for j in range(len(mine)) if mine[j] == 1 and grad.shape[j + 1] != 1)
    return grad.sum(dims, keepdim=True) if dims else grad


def _lead(t: Tensor) -> int | None:
    return int(t.shape[0]) if t.dim() else None


def _get(args: list[Any], kwargs: dict[str, Any], slot: _Slot) -> Any:
    return args[slot] if isinstance(slot, int) else kwargs[slot]


def _put(args: list[Any], kwargs: dict[str, Any], slot: _Slot, value: Any) -> None:
    if isinstance(slot, int):
        args[slot] = value
    else:
        kwargs[slot] = value
