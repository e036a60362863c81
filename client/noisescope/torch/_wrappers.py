"""Which training wrapper holds the model, and where its gradients can be read.

- one process, or ``DistributedDataParallel``: every parameter is a plain tensor; a hook on it
  sees each backward's incoming gradient, and ``.grad`` at the step is the gradient the
  optimizer sees (all-reduced and identical on every rank under DDP).
- FSDP2 (``torch.distributed.fsdp.fully_shard``): the module's parameters are sharded
  ``DTensor``s that the forward never uses: before each forward FSDP puts an unsharded plain
  parameter in their place, and autograd computes this rank's full local gradient into it;
  FSDP then reduce-scatters it into the shards' ``.grad`` (averaged over ranks, as DDP does),
  or, under ``set_requires_gradient_sync(False)``, keeps accumulating it unsharded. So the
  G_small hooks go on the unsharded parameters (found in a forward pre-hook of each module
  that owns parameters, after FSDP's own pre-hook has put them there), and |G_big|^2 is the
  sum over ranks of the local shards' squared norms.
- DeepSpeed ZeRO stages 1 and 2: whole parameters, hooked as under DDP; |G_big|^2 is the
  engine's own norm of the reduced gradient (``_deepspeed``).

Wrappers whose gradients cannot be read this way (FSDP1's flat parameters, ZeRO stage 3,
``nn.DataParallel``) are refused with an error naming what is supported.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from . import _deepspeed

Kind = Literal["single", "ddp", "fsdp2", "deepspeed"]

SUPPORTED = (
    "one process, torch.nn.parallel.DistributedDataParallel, FSDP2 "
    "(torch.distributed.fsdp.fully_shard over a 1-D device mesh), or a DeepSpeed engine "
    "with ZeRO stage 1 or 2"
)

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover - a torch built without torch.distributed
    DTensor = None  # type: ignore[assignment,misc]


@dataclass(frozen=True)
class Layout:
    """The model's wrapper: what to hook, and over which ranks the step's sums add up."""

    kind: Kind
    inner: nn.Module  # the module whose parameters are measured
    process_group: Any  # the ranks that share the step (None: the default group)
    world_size: int
    #: ``torch.compile``'s wrapper, if the model is compiled: its forward runs eagerly, so
    #: hooks that must not be traced (they would break the graph) go there, not on ``inner``
    compiled: nn.Module | None = None
    #: the DeepSpeed engine around ``inner`` (kind "deepspeed")
    engine: Any = None

    @property
    def distributed(self) -> bool:
        return self.kind != "single"

    @property
    def sharded(self) -> bool:
        """Whether ``.grad`` holds a shard: |G_big|^2 is a sum over ranks."""
        return self.kind == "fsdp2"


def fsdp1_refused() -> TypeError:
    """FSDP1's flat parameters: the error naming what to use instead."""
    return TypeError(
        "noisescope: FSDP1 (FullyShardedDataParallel, e.g. Lightning's FSDPStrategy) is not "
        "supported: its flat parameters hide each parameter's gradient. Use FSDP2 "
        "(torch.distributed.fsdp.fully_shard; Lightning's ModelParallelStrategy, "
        f"Accelerate's fsdp_version=2). Supported: {SUPPORTED}."
    )


def _refuse(model: nn.Module) -> None:
    """Wrappers whose gradients the probe cannot read: an error, never a wrong number."""
    fsdp1: Any = None
    with contextlib.suppress(ImportError):
        from torch.distributed.fsdp import FullyShardedDataParallel as fsdp1
    if fsdp1 is not None and any(isinstance(m, fsdp1) for m in model.modules()):
        raise fsdp1_refused()
    if isinstance(model, nn.DataParallel):
        raise TypeError(
            "noisescope: nn.DataParallel (several devices in one process) is not supported; "
            f"use DistributedDataParallel. Supported: {SUPPORTED}."
        )


def _dtensor_group(params: list[nn.Parameter]) -> Any:
    """FSDP2's process group: the 1-D mesh every sharded parameter lives on (each
    ``fully_shard`` call may build its own, equal, mesh object)."""
    sharded: list[Any] = list(params)  # DTensors
    mesh = sharded[0].device_mesh
    if any(p.device_mesh != mesh for p in sharded):
        raise TypeError(
            "noisescope: the model's parameters are sharded over different device meshes; "
            f"supported: {SUPPORTED}."
        )
    if mesh.ndim != 1:
        raise TypeError(
            f"noisescope: a {mesh.ndim}-D device mesh (HSDP or tensor parallelism) is not "
            f"supported: the probe adds shards over one dimension. Supported: {SUPPORTED}."
        )
    return mesh.get_group()


def _uncompiled(model: nn.Module) -> tuple[nn.Module, nn.Module | None]:
    """``torch.compile(model)`` -> (model, its compiled wrapper). A model whose forward
    method alone is compiled (``model.forward = torch.compile(model.forward)``, the way to
    compile an FSDP2 root, whose hooks dynamo does not trace) is its own eager wrapper: its
    module call, with the hooks on it, runs outside the graph."""
    orig = getattr(model, "_orig_mod", None)
    if isinstance(orig, nn.Module):
        return orig, model
    if getattr(model.__dict__.get("forward"), "_torchdynamo_orig_callable", None) is not None:
        return model, model
    return model, None


def detect(model: nn.Module, process_group: Any = None) -> Layout:
    """The layout of ``model``'s gradients (``process_group``: DDP's, default the world)."""
    model, compiled = _uncompiled(model)
    dist = torch.distributed
    initialized = dist.is_available() and dist.is_initialized()
    if _deepspeed.is_engine(model):
        _deepspeed.check(model)
        engine: Any = model
        inner, compiled_inner = _uncompiled(engine.module)
        group = process_group if process_group is not None else _deepspeed.group(model)
        world = dist.get_world_size(group) if initialized else 1
        return Layout("deepspeed", inner, group, world, compiled or compiled_inner, model)
    _refuse(model)
    if isinstance(model, nn.parallel.DistributedDataParallel):
        inner, compiled_inner = _uncompiled(model.module)
        compiled = compiled or compiled_inner
        if not initialized:
            return Layout("single", inner, None, 1, compiled)
        group = process_group if process_group is not None else model.process_group
        return Layout("ddp", inner, group, dist.get_world_size(group), compiled)
    params = [p for p in model.parameters() if p.requires_grad]
    if DTensor is not None and any(isinstance(p, DTensor) for p in params):
        if not all(isinstance(p, DTensor) for p in params):
            raise TypeError(
                "noisescope: some of the model's parameters are sharded (DTensor) and some are "
                "not: apply fully_shard to the root module too. Supported: " + SUPPORTED + "."
            )
        group = process_group if process_group is not None else _dtensor_group(params)
        return Layout("fsdp2", model, group, dist.get_world_size(group), compiled)
    return Layout("single", model, None, 1, compiled)


def may_all_reduce(model: nn.Module, layout: Layout) -> bool:
    """Could the coming backward overwrite .grad with a reduced gradient?"""
    if layout.sharded or layout.kind == "deepspeed":
        return True
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return False
    if layout.distributed:  # DDP: all-reduces unless under no_sync or alone in its group
        sync = getattr(model, "require_backward_grad_sync", True)
        return bool(sync) and layout.world_size > 1
    # a process group with a wrapper we do not know: assume so, unless there is no peer
    # (torchrun with one process): a reduction over one rank leaves .grad as it is
    return bool(dist.get_world_size() > 1)


def local_grad(grad: Tensor) -> Tensor:
    """This rank's part of a gradient: a DTensor's local shard, a plain tensor itself."""
    if DTensor is not None and isinstance(grad, DTensor):
        return grad.to_local()
    return grad


HookFactory = Callable[[int, torch.dtype], Callable[[Tensor], None]]


class UnshardedHooks:
    """FSDP2: a gradient hook on each unsharded parameter that a forward uses.

    ``make_hook(i, dtype)`` builds the hook for measured parameter ``i`` (a gradient has its
    unsharded parameter's dtype, which FSDP's mixed precision may make bf16). FSDP keeps one
    unsharded tensor per parameter across steps, so each gets its hook once; a pre-hook that
    finds the same tensor returns after one identity check per parameter.
    """

    def __init__(
        self,
        inner: nn.Module,
        params: list[nn.Parameter],
        make_hook: HookFactory,
        wrap: Callable[[Callable[..., Any], bool], Callable[..., Any]],
    ) -> None:
        index = {id(p): i for i, p in enumerate(params)}
        self._make_hook = make_hook
        self._hooked: dict[tuple[int, str], tuple[Tensor, RemovableHandle]] = {}
        self._handles: list[RemovableHandle] = []
        for module in inner.modules():
            own = [
                (name, index[id(p)])
                for name, p in module.named_parameters(recurse=False)
                if id(p) in index
            ]
            if own:
                pre_hook = wrap(self._pre_hook(own), False)
                self._handles.append(module.register_forward_pre_hook(pre_hook))
                # and after the forward (before its backward): a probe made inside a forward
                # (the Hugging Face callback makes it at the first one) missed that module's
                # pre-hook; the root module keeps its parameters unsharded until the backward
                self._handles.append(module.register_forward_hook(pre_hook))

    def _pre_hook(self, own: list[tuple[str, int]]) -> Callable[..., None]:
        hooked = self._hooked

        def pre_hook(module: nn.Module, *args: Any) -> None:
            for name, i in own:
                key = (id(module), name)
                current = getattr(module, name)
                seen = hooked.get(key)
                if seen is not None and seen[0] is current:
                    continue
                if not isinstance(current, Tensor) or isinstance(current, DTensor):
                    continue  # still sharded: not this forward's parameter
                if seen is not None:
                    seen[1].remove()
                handle = current.register_hook(self._make_hook(i, current.dtype))
                hooked[key] = (current, handle)

        return pre_hook

    def remove(self) -> None:
        for _, handle in self._hooked.values():
            handle.remove()
        self._hooked.clear()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
