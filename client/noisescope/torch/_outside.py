"""Uses of a parameter outside its own module's forward: what the probe does with each one
``_functional.FollowUses`` reports (the mode's host side, a mixin of ``PerExampleNorms``).

A linear use is recorded like a Linear layer's use, an elementwise broadcast like a container's
own parameter; any other moves the parameter to torch.func over the smallest running module
that holds it (found on the Python call stack), which from then on accounts for every use of
the parameter inside it.
"""

from __future__ import annotations

import sys

import torch
from torch import Tensor, nn

from ._broadcast import over_batch, per_example
from ._capture import CaptureUses
from ._functional import FollowUses
from ._uses import Entry, head, tensor_at


def in_parametrization(name: str) -> bool:
    """Whether a module's name is inside a parametrization (``parametrizations.weight``)."""
    return ".parametrizations." in f".{name}."


class OutsideUses(CaptureUses):
    """The host of ``FollowUses`` (a mixin: ``PerExampleNorms`` holds the state)."""

    model: nn.Module
    entries: list[Entry]
    followed: list[str]
    _follow: FollowUses | None
    _active: dict[int, int]
    _owners: dict[int, list[Entry]]
    _names: dict[int, str]
    _functional: dict[tuple[int, str, int | None], Entry]
    _moved: set[int]
    _unsupported: str | None
    _retry: bool

    def _hook(self, entry: Entry) -> None:
        raise NotImplementedError

    @property
    def following(self) -> bool:
        """Whether uses outside modules are being followed (a measured forward under way)."""
        return self._follow is not None and self._follow.depth > 0

    def accounted(self, idx: int) -> bool:
        """Whether a hooked module that accounts for parameter ``idx`` is running."""
        if self._recomputing:
            return True
        active = self._active
        return any(active.get(id(e.module), 0) for e in self._owners.get(idx, ()))

    def linear(
        self, idx: int, form: str, x: Tensor, out: Tensor, swap: bool, bias: int | None
    ) -> bool:
        """A linear use of parameter ``idx`` (and of a bias ``bias``) outside its module: its
        per-example gradient by the Linear identity, like a Linear layer's use."""
        batch = self._batch_size
        if batch is None or x.dim() < (3 if swap else 2) or int(x.shape[0]) != batch:
            return False
        if out.dim() < 2 or int(out.shape[0]) != batch:
            return False
        key = (idx, form, bias)
        entry = self._functional.get(key)
        if entry is None:
            holder = nn.Module()
            holder.weight = tensor_at(self.model, self._names[idx])
            params = [("weight", idx)]
            if bias is not None:
                holder.bias = tensor_at(self.model, self._names[bias])
                params.append(("bias", bias))
            label = f"F.{form}({self._names[idx]})"
            entry = self._functional[key] = Entry(holder, label, params, form)
            for _, i in params:
                self._owners.setdefault(i, []).append(entry)
        use = self._new_use(entry, {})
        keep = self._keep(batch)
        use.swap = swap
        use.args = (head(x.transpose(-1, -2) if swap else x, keep, batch),)
        self._uses.setdefault(id(entry), []).append(use)
        out.register_hook(self._wrap(lambda delta: self._backward(use, delta, keep), True))
        return True

    def broadcast(self, idx: int, value: Tensor, others: list[Tensor]) -> Tensor | None:
        """Parameter ``idx`` (or a cast of it) broadcast over the batch by an elementwise op
        outside its module: the op gets an expanded copy, whose gradient hook gives each
        example's gradient (summed over the copies of its positions)."""
        batch = self._batch_size
        if batch is None or not value.requires_grad:
            return None
        try:
            shape = torch.broadcast_shapes(value.shape, *(o.shape for o in others))
        except RuntimeError:
            return None
        if (
            not over_batch(value.shape, shape, batch)
            or value.shape != tensor_at(self.model, self._names[idx]).shape
        ):
            return None
        key = (idx, "bare", None)
        entry = self._functional.get(key)
        if entry is None:
            holder = nn.Module()
            holder.weight = tensor_at(self.model, self._names[idx])
            label = f"F.broadcast({self._names[idx]})"
            entry = self._functional[key] = Entry(holder, label, [("weight", idx)], "bare")
            self._owners.setdefault(idx, []).append(entry)
        use = self._new_use(entry, {})
        keep = self._keep(batch)
        self._uses.setdefault(id(entry), []).append(use)
        expanded = value.expand(shape)
        mine = value.shape

        def hook(grad: Tensor) -> None:
            self._backward(use, per_example(grad, mine), keep)

        expanded.register_hook(self._wrap(hook, True))
        return expanded

    def other(self, idx: int, op: str) -> None:
        """A use of parameter ``idx`` outside its module that no identity follows: torch.func over
        the smallest module whose forward holds the use (running now) accounts for the parameter
        from this call on (its other entries inside that module give it up)."""
        name = self._names[idx]
        where = _enclosing(self.model, tensor_at(self.model, name))
        if where is None or idx in self._moved:
            self._unsupported = self._unsupported or (
                f"parameter {name} is used by {op} outside its own module's forward, in a way "
                "that cannot be followed"
            )
            self._retry = False
            return
        label, module, local = where
        self._moved.add(idx)
        for e in list(self._owners.get(idx, ())):
            inside = any(m is e.module for m in module.modules())
            if inside or e.label.startswith("F."):
                e.drop(idx)
                self._owners[idx].remove(e)
        entry = next((e for e in self.entries if e.module is module and e.kind != "bare"), None)
        if entry is None:
            # a module called with no forward hook skips them all: this call is lost
            lost = not (module._forward_hooks or module._forward_pre_hooks)
            entry = Entry(module, label, [(local, idx)], "func")
            self._hook(entry)
            # its forward is under way: its hook, registered now, still sees this call
            self._active[id(module)] = max(1, self._active[id(module)])
            if lost:
                self._cannot(entry, f"{name} is used outside its module ({op})", retry=True)
        else:
            entry.kind = "func"
            entry.add(local, idx)
            self._owners.setdefault(idx, []).append(entry)
        self.followed.append(f"{name} (used by {op}): torch.func over {label}")


def _enclosing(model: nn.Module, param: Tensor) -> tuple[str, nn.Module, str] | None:
    """The smallest module of ``model`` whose forward (or a method it called) is running and
    holds ``param``: (its label, the module, the parameter's name below it). Parametrizations'
    own modules are skipped: the parametrized module holds their originals."""
    names = {id(m): n for n, m in model.named_modules() if not in_parametrization(n)}
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, nn.Module) and id(owner) in names:
            for name, p in owner.named_parameters(remove_duplicate=False):
                if p is param:
                    return names[id(owner)] or "(model)", owner, name
        frame = frame.f_back  # type: ignore[assignment]
    return None
