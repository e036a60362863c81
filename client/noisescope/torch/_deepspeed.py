"""DeepSpeed ZeRO stages 1 and 2: where the probe reads the two gradients of a step.

- |G_small|^2: ZeRO 1/2 leave the parameters whole on every rank (only gradients and optimizer
  state are partitioned), so a tensor hook on each parameter sees each backward's incoming,
  local gradient, as under DDP, before DeepSpeed's own hooks on the gradient accumulator
  reduce it into its partitions. ``engine.backward`` divides the loss by
  ``gradient_accumulation_steps`` (micro_loss "mean/k") and, in fp16, multiplies it by the
  optimizer's loss scale, which the probe divides out of these gradients.
- |G_big|^2: the square of ``engine.get_global_grad_norm()``, the norm DeepSpeed itself
  computes in ``engine.step()`` at the accumulation boundary, of the gradient averaged over the
  data-parallel ranks, loss scale divided out, before clipping; it costs the probe nothing and
  is the same on every rank. It only exists after ``engine.step()``: under DeepSpeed
  ``probe.step()`` comes after ``engine.step()``, on every micro-batch like it, and closes a
  step only when the engine took one (``engine.global_steps`` moved).

One norm for the whole model: per-layer series are refused. Stage 3 (parameters partitioned
too: the forward's gathered parameters are freed after use), stage 0, pipeline and model
parallelism, MoE and DeepSpeed's ``torch_autocast`` are refused with an error naming what is
supported.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

SUPPORTED = (
    "DeepSpeed ZeRO stages 1 and 2 with data parallelism only (fp32, bf16 or fp16 weights), "
    "the gradient norm computed (zero_optimization.compute_grad_norm, the default)"
)


def in_callback(framework: str) -> TypeError:
    """The callbacks close a step before the optimizer steps; DeepSpeed's norm comes after."""
    return TypeError(
        f"noisescope: the {framework} callback does not support DeepSpeed: it would read the "
        "gradients from .grad, which ZeRO empties into its partitions, and log wrong numbers. "
        "Use GradientNoiseProbe(engine, run) in a DeepSpeed training loop (docs/sources.md). "
        f"Supported there: {SUPPORTED}."
    )


STEP_ORDER = (
    "under DeepSpeed call probe.step() after engine.step(), on every micro-batch: the "
    "reduced gradient's norm is computed inside engine.step(). The engine took an optimizer "
    "step that probe.step() did not see (was it called before engine.step()?)"
)


def is_engine(model: nn.Module) -> bool:
    """A DeepSpeed engine, told without importing DeepSpeed for every other model."""
    if not type(model).__module__.startswith("deepspeed."):
        return False
    try:
        from deepspeed.runtime.engine import DeepSpeedEngine
    except ImportError:  # a class named deepspeed.* without the package: not an engine
        return False
    return isinstance(model, DeepSpeedEngine)


def _refuse(what: str) -> TypeError:
    return TypeError(f"noisescope: {what} is not supported. Supported: {SUPPORTED}.")


def check(engine: Any) -> None:
    """Refuse what the probe cannot read correctly (raises TypeError)."""
    from deepspeed.runtime.pipe.engine import PipelineEngine

    if isinstance(engine, PipelineEngine):
        raise _refuse("DeepSpeed's PipelineEngine (pipeline parallelism)")
    stage = engine.zero_optimization_stage()
    if stage not in (1, 2):
        why = (
            "its parameters are partitioned too, and the forward's gathered copies are freed "
            "before their gradients could be read whole"
            if stage == 3
            else "without ZeRO the engine has no global gradient norm to read"
        )
        raise _refuse(f"DeepSpeed ZeRO stage {stage} ({why})")
    if engine.mpu is not None:
        raise _refuse("DeepSpeed with model parallelism (an mpu)")
    if engine.has_moe_layers:
        raise _refuse("DeepSpeed with MoE layers (expert gradients are averaged differently)")
    if _setting(engine, "torch_autocast_enabled", False):
        raise _refuse("DeepSpeed's torch_autocast mode (its GradScaler is not read)")
    if not _setting(engine, "zero_compute_grad_norm", True):
        raise _refuse("zero_optimization.compute_grad_norm=false (the norm the probe reads)")


def _setting(engine: Any, name: str, default: bool) -> bool:
    """An engine's config accessor; ``default``: the behaviour of releases without it."""
    try:
        accessor = getattr(engine, name)
    except AttributeError:
        return default
    return bool(accessor())


def group(engine: Any) -> Any:
    """The data-parallel ranks whose gradients DeepSpeed averages."""
    return engine.seq_data_parallel_group


class EngineGrads:
    """The engine's side of a step: its loss scale, whether it stepped, its gradient norm."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._steps_seen = int(engine.global_steps)

    def loss_scale(self) -> float:
        """The factor ``engine.backward`` multiplied the loss by (fp16; 1 otherwise). It only
        changes inside ``engine.step()`` at a boundary, so one read per step is enough."""
        scale = getattr(self.engine.optimizer, "loss_scale", 1.0)
        return float(scale)

    def stepped(self) -> bool:
        """Did the engine take an optimizer step since the last call that said so?"""
        steps = int(self.engine.global_steps)
        if steps == self._steps_seen:
            return False
        self._steps_seen = steps
        return True

    def pending_step(self) -> bool:
        """Did the engine step without ``stepped()`` being asked (probe.step() out of order)?"""
        return int(self.engine.global_steps) != self._steps_seen

    def reduced_sq(self, device: torch.device) -> Tensor:
        """|G_big|^2 of the step just taken, shape (1,), float64, left on the device."""
        norm = self.engine.get_global_grad_norm()
        if norm is None:
            raise RuntimeError(
                "engine.get_global_grad_norm() is None: DeepSpeed computed no gradient norm "
                "this step (zero_optimization.compute_grad_norm=false?)"
            )
        if isinstance(norm, Tensor):
            return norm.detach().to(device=device, dtype=torch.float64).square().view(1)
        # a float: inf after an fp16 overflow (the step is then skipped as non-finite)
        return torch.tensor([float(norm)], dtype=torch.float64, device=device).square()
