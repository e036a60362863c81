"""Detecting a ``probe.step()`` that comes too late: after the gradients were changed.

``step()`` reads the gradient the optimizer sees as |G_big|^2 and compares it with the
backwards' own gradients, so it must see ``.grad`` exactly as the last backward left it.
Two mistakes silently give wrong numbers:

- ``scaler.unscale_(optimizer)`` before ``step()``: the probe divides the loss scale out of
  gradients that no longer carry it, so |G_big|^2 comes out ~scale^2 too small and tr(Sigma)
  and B_simple meaningless (often negative). Seen in the GradScaler's per-optimizer state.
- gradient clipping (or any in-place change) before ``step()``: |G_big|^2 shrinks, B_simple
  grows (+300% in the issue's example). Seen as a changed in-place version counter of the
  gradients between the end of the last backward and ``step()``.

The end of a backward is caught with a gradient hook that queues a callback to run after the
backward (and after DDP's and FSDP's end-of-backward work); the callback notes a few gradients'
version counters. The hook sits on the first measured parameter, registered once: it fires in
every backward that reaches the parameter. Under FSDP2 the backward never reaches the sharded
parameters, so there it goes on the output of each forward of the measured model instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from noisescope import _wire

from ._instrument import Wrap
from ._torch_api import queue_after_backward, scaler_unscaled, version

#: Clipping and unscaling change every gradient: a few tell.
_WATCHED = 8

UNSCALED = (
    "probe.step() was called after scaler.unscale_(): the gradients had already been "
    "un-scaled, so the probe would divide the loss scale out twice (|G_big|^2 wrong, "
    "tr(Sigma) and B_simple meaningless). This step is not logged. Call probe.step() right "
    "after the last backward, before scaler.unscale_(optimizer) and gradient clipping."
)
MODIFIED = (
    "probe.step() saw gradients changed in place since the last backward (gradient clipping, "
    "scaler.unscale_() or a manual rescale before probe.step()): |G_big|^2 would be that of "
    "the changed gradient (clipping makes B_simple too large). This step is not logged. Call "
    "probe.step() right after the last backward, before unscaling and clipping."
)

#: no sample can come from a step with one batch size
SINGLE_BATCH_SIZE = (
    "this step has one batch size only (one process, one backward): nothing can be measured. "
    "Use gradient accumulation (several backward passes per optimizer step, e.g. "
    "accumulate_grad_batches or gradient_accumulation_steps > 1), several data-parallel "
    "processes, or source='per_example'"
)


#: per-example hooks hidden by a graph compiled before the probe
STALE_GRAPH = (
    "no per-example gradients were captured from the compiled model: torch.compile reused a "
    "graph compiled before the probe existed, without its hooks (for this model or another "
    "instance of its class; dynamo does not guard on module hooks by default). Create the "
    "probe before compiling, or set torch._dynamo.config.skip_nnmodule_hook_guards = False "
    "before the first compilation, or call torch.compiler.reset() after creating the probe; "
    "or use source='micro', whose hooks are outside the graph"
)


def _first_grad_tensor(value: Any) -> Tensor | None:
    """The first tensor in a forward's output that the backward will reach."""
    if isinstance(value, Tensor):
        return value if value.requires_grad else None
    items: Iterable[Any] = ()
    if isinstance(value, Mapping):
        items = value.values()
    elif isinstance(value, (tuple, list)):
        items = value
    for item in items:
        if isinstance(item, Tensor) and item.requires_grad:
            return item
    return None


class GradWatch:
    """Notes the gradients' version counters at the end of each backward; ``check`` says
    whether they changed (or were unscaled) before ``step()``."""

    def __init__(
        self,
        modules: Iterable[nn.Module],
        params: list[nn.Parameter],
        wrap: Wrap,
        *,
        sharded: bool = False,
    ) -> None:
        self.armed = False
        self._on_grad_hook = wrap(self._on_grad, True)
        self._record_hook = wrap(self._record, False)
        self._params = params[:_WATCHED]
        self._marks: list[tuple[nn.Parameter, Tensor, int]] | None = None
        self._pending = False  # a backward is running, its callback not yet run
        self._handles: list[RemovableHandle] = []
        if sharded:  # FSDP2: the backward reaches the forward's unsharded parameters only
            for m in dict.fromkeys(modules):
                self._handles.append(m.register_forward_hook(wrap(self._after_forward, False)))
        else:  # once, not per forward: a forward hook and a tensor hook per forward cost more
            self._handles.append(params[0].register_hook(self._on_grad_hook))

    def _after_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        """Inside a compiled caller (Lightning compiles ``training_step`` too) the hook is
        traced: it does nothing there, since its gradient hook's end-of-backward callback
        would break the graph; the step goes unwatched."""
        if torch.compiler.is_compiling() or not self.armed or not torch.is_grad_enabled():
            return
        out = _first_grad_tensor(output)
        if out is not None:
            out.register_hook(self._on_grad_hook)

    def _on_grad(self, grad: Tensor) -> None:
        if self.armed and not self._pending:
            self._pending = True
            queue_after_backward(self._record_hook)

    def _record(self) -> None:
        self._pending = False
        self._marks = [
            (p, g, v)
            for p in self._params
            if (g := p.grad) is not None and (v := version(g)) is not None
        ]

    def check(self, scaler: Any) -> str | None:
        """Why this step's gradients are not the backwards' own (None: they are)."""
        if scaler is not None and scaler.is_enabled() and scaler_unscaled(scaler):
            self._marks = None
            return UNSCALED
        if self._pending:  # step() inside the end-of-backward callbacks (Hugging Face)
            self._record()
        marks, self._marks = self._marks, None
        if marks is None:
            return None
        for p, g, v in marks:
            if p.grad is not g or version(g) != v:
                return MODIFIED
        return None

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def notice(sink: Any, step: int, message: str) -> None:
    """Say on the run's page why it has no samples: a warning reaches only the training log.
    A plain ``Sink`` has no events; a failing one must not reach training either."""
    log_event = getattr(sink, "log_event", None)
    if log_event is None:
        return
    with contextlib.suppress(Exception):
        log_event(step, _wire.NOTICE_EVENT_KIND, {"message": message})
