"""The private torch APIs the probe uses, each with a public fallback, in one place.

Private names move between torch releases; when one is missing, the probe must still measure
(slower, or with a misuse check fewer), never fail.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

_foreach_norm: Any = getattr(torch, "_foreach_norm", None)
_foreach_copy_: Any = getattr(torch, "_foreach_copy_", None)


def foreach_norm(tensors: Sequence[Tensor], dtype: torch.dtype | None = None) -> list[Tensor]:
    """The 2-norm of each tensor (in ``dtype``): one batched kernel where torch has it."""
    if _foreach_norm is not None:
        if dtype is None:
            return list(_foreach_norm(list(tensors)))
        return list(_foreach_norm(list(tensors), 2, dtype=dtype))
    return [torch.linalg.vector_norm(t, dtype=dtype) for t in tensors]


def foreach_copy_(targets: Sequence[Tensor], sources: Sequence[Tensor]) -> None:
    if _foreach_copy_ is not None:
        _foreach_copy_(list(targets), list(sources))
        return
    for target, source in zip(targets, sources, strict=True):
        target.copy_(source)


def queue_after_backward(fn: Callable[[], None]) -> None:
    """Run ``fn`` once the running backward pass has finished, after DDP's and FSDP's
    end-of-backward work.

    DDP queues its all-reduce finalizer when its last gradient bucket is ready, i.e. after any
    hook on the loss fires; a callback queued from inside our first callback lands behind it
    (the engine runs callbacks queued while it runs callbacks). Must be called during backward.
    """
    engine: Any = torch.autograd.Variable._execution_engine
    engine.queue_callback(lambda: engine.queue_callback(fn))


def version(tensor: Tensor) -> int | None:
    """The in-place modification counter of ``tensor`` (None where torch has none)."""
    counter = getattr(tensor, "_version", None)
    return counter if isinstance(counter, int) else None


def scaler_unscaled(scaler: Any) -> bool:
    """Whether ``scaler.unscale_(optimizer)`` already ran this step for some optimizer.

    Read from the GradScaler's per-optimizer state; False where that state is not there.
    """
    states = getattr(scaler, "_per_optimizer_states", None)
    if not isinstance(states, dict):
        return False
    try:
        from torch.amp.grad_scaler import OptState
    except ImportError:  # pragma: no cover
        return False
    return any(
        isinstance(state, dict) and state.get("stage") is OptState.UNSCALED
        for state in states.values()
    )


def loss_scale(scaler: Any, device: torch.device) -> Tensor:
    """A GradScaler's current scale as a float64 tensor on ``device``, without reading it to
    the host: its scale tensor where the scaler has one (private), else ``get_scale()``."""
    scale = getattr(scaler, "_scale", None)
    if isinstance(scale, Tensor):
        return scale.detach().to(device, torch.float64)
    return torch.tensor(float(scaler.get_scale()), dtype=torch.float64, device=device)


def guard_module_hooks() -> None:
    """Make torch.compile recompile a graph whose modules' hooks changed.

    Dynamo skips guards on module hooks by default: code compiled for one instance of a module
    class, without hooks, is reused for another instance (or the same one) after the
    per-example hooks were attached, and the hooks never run. Process-wide; a no-op where
    the setting does not exist.
    """
    with contextlib.suppress(Exception):
        import torch._dynamo.config as dynamo_config

        if getattr(dynamo_config, "skip_nnmodule_hook_guards", None) is True:
            dynamo_config.skip_nnmodule_hook_guards = False
