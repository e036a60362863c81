"""Capture of uses: the forward hooks that record each call of a measured module (its inputs,
and a gradient hook on its output), for batch-first, routed and batch-less inputs, and a
container's own parameters swapped for ``_broadcast`` views during its forward."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from ._broadcast import Capture
from ._instrument import Wrap
from ._uses import (
    Entry,
    Use,
    first_output,
    first_tensor,
    from_parameters,
    head,
    in_backward,
    routed_rows,
)


class CaptureUses:
    """The forward side of ``PerExampleNorms`` (a mixin: it holds the state)."""

    armed: bool
    _recomputing: bool
    _wrap: Wrap
    _uses: dict[int, list[Use]]
    _recomputed: set[int]
    _captures: list[Capture]
    _root_ids_ndim: int | None
    _batch_seen: int | None
    _batch_hint: int | None
    max_examples: int | None

    @property
    def _batch_size(self) -> int | None:
        raise NotImplementedError

    def _new_use(self, entry: Entry, kwargs: dict[str, Any]) -> Use:
        raise NotImplementedError

    def _backward(self, use: Use, delta: Tensor, keep: int | None) -> None:
        raise NotImplementedError

    def _cannot(self, entry: Entry, why: str, retry: bool = False) -> None:
        raise NotImplementedError

    def _error(self, exc: BaseException) -> None:
        raise NotImplementedError

    def other(self, idx: int, op: str) -> None:
        raise NotImplementedError

    @property
    def following(self) -> bool:
        raise NotImplementedError

    def _make_forward_hook(
        self, entry: Entry
    ) -> Callable[[nn.Module, tuple[Any, ...], dict[str, Any], Any], Any]:
        def hook(
            module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
        ) -> Any:
            if not self.armed or self._recomputing or not torch.is_grad_enabled():
                return None
            if not entry.params:
                return None
            try:
                return self._forward(entry, args, kwargs, output)
            except Exception as exc:  # never inside the user's forward
                self._error(exc)
                return None

        # run eagerly, never traced: dynamo would guard on the probe's per-step state
        # (``len(self._uses)`` grows with each layer called) and compile this one hook again
        # for each hooked layer, up to its recompile limit (docs/sources.md, "Setups")
        return cast(
            Callable[[nn.Module, tuple[Any, ...], dict[str, Any], Any], Any],
            torch.compiler.disable(hook),
        )

    def _forward(
        self, entry: Entry, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> Any:
        out = first_output(output)
        if entry.kind == "bare" or not isinstance(out, Tensor) or not out.requires_grad:
            return None
        uses = self._uses.setdefault(id(entry), [])
        if in_backward():
            if uses:
                return None  # gradient checkpointing recomputes a forward already counted
            self._recomputed.update(idx for _, idx in entry.params)
        first = first_tensor(args, kwargs)
        lead = int(out.shape[0]) if out.dim() else None
        if entry.kind == "embedding_bag" and first is not None and first.dim() == 1 and lead:
            # flat ids with offsets: one example per bag, the bags are the batch
            self._batch_hint = lead
            keep = self._keep(lead)
            use = self._new_use(entry, {k: head(v, None, -1) for k, v in kwargs.items()})
            use.args = tuple(head(a, None, -1) for a in args)
            uses.append(use)
            out.register_hook(self._wrap(lambda delta: self._backward(use, delta, keep), True))
            return None
        batch = self._batch_size
        batch_first = (
            first is not None
            and lead is not None
            and int(first.shape[0]) == lead
            and (batch is None or lead == batch)
            and not self._batch_free(first)
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
            use.args = tuple(head(a, keep, lead) for a in args)
            use.kwargs = {k: head(v, keep, lead) for k, v in kwargs.items()}
            if entry.kind == "embedding" and isinstance(use.args[0], Tensor):
                use.ids = use.args[0].reshape(use.args[0].shape[0], -1)
            uses.append(use)
            out.register_hook(self._wrap(lambda delta: self._backward(use, delta, keep), True))
            return None
        rows = None
        if first is not None and batch is not None and first.is_floating_point() and lead != 1:
            rows = routed_rows(first, batch)
        if rows is not None and lead is not None:
            # rows picked out of the batch (an expert's tokens): each row's example is known
            use.args = tuple(a.detach() if isinstance(a, Tensor) else a for a in args)
            use.rows = rows
            uses.append(use)
            out.register_hook(self._wrap(lambda delta: self._backward(use, delta, None), True))
            return None
        # batch-less: one value for all examples (positions, buffers, a table of parameters),
        # broadcast later
        batch_less = lead == 1 or first is None or not first.is_floating_point()
        batch_less = batch_less or (first is not None and self._batch_free(first))
        if not batch_less and first is not None:
            batch_less = from_parameters(first)
        if batch_less and batch is not None and not isinstance(output, tuple):
            use.args = tuple(a.detach() if isinstance(a, Tensor) else a for a in args)
            use.batch_less = True
            uses.append(use)
            keep = self._keep(batch)
            capture = Capture(
                out,
                batch,
                self._wrap(lambda delta: self._backward(use, delta, keep), True),
                lambda why: self._batch_less_failed(entry, use, why),
                entry.checking(),
            )
            return capture.wrap(out)
        shape = tuple(first.shape) if first is not None else None
        self._cannot(
            entry,
            f"got an input of shape {shape} whose first dimension is not the batch's "
            f"({batch}): its rows are not the batch's examples (e.g. an expert fed only the "
            "tokens routed to it, or a sequence-first layer)",
        )
        return None

    def _bare_hooks(self, module: nn.Module, entries: list[Entry]) -> list[RemovableHandle]:
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
            if in_backward() and any(self._uses.get(id(e)) for e in entries):
                return  # gradient checkpointing recomputes a forward already counted
            batch = self._batch_size
            for entry in entries:
                if entry.kind != "bare" or not entry.params:
                    continue  # given up to torch.func (``_enclosed``)
                name, _ = entry.params[0]
                param = module._parameters.get(name)
                if param is None or not param.requires_grad:
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

    def _capture(self, entry: Entry, param: Tensor, batch: int) -> Tensor:
        use = self._new_use(entry, {})
        use.batch_less = True
        self._uses.setdefault(id(entry), []).append(use)
        self._recomputed.update(idx for _, idx in entry.params)  # its uses: the view's
        keep = self._keep(batch)

        def failed(why: str) -> None:
            if self._enclosed(entry, use, why):
                return
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

    def _enclosed(self, entry: Entry, use: Use, why: str) -> bool:
        """A batch-less value of ``entry`` (its output, or a container's own parameter) that
        cannot be followed to the batch, met in the forward: torch.func over the smallest
        running module holding its parameters (where the batch comes in) accounts for them,
        from this call on (``PerExampleNorms.other``). False where that cannot be done."""
        if in_backward() or not self.following:
            return False
        uses = self._uses.get(id(entry), [])
        if use in uses:
            uses.remove(use)
        for _, idx in list(entry.params):
            self.other(idx, f"{entry.label}, whose batch-less value {why}")
        return True

    def _batch_less_failed(self, entry: Entry, use: Use, why: str) -> None:
        if not self._enclosed(entry, use, why):
            self._cannot(entry, why)

    def _batch_free(self, t: Tensor) -> bool:
        """``t`` computed without the batch's data in this forward (``_functional``)."""
        follow = getattr(self, "_follow", None)
        return follow is not None and bool(follow.batch_free(t))

    def _keep(self, batch: int) -> int | None:
        """Only the first max_examples examples are measured: cost scales with their number."""
        return self.max_examples if self.max_examples and self.max_examples < batch else None
