"""Hugging Face ``transformers`` integration: a ``TrainerCallback`` that tracks the noise scale.

A thin layer over the plain-loop API: ``noisescope.init`` plus
``noisescope.torch.GradientNoiseProbe``. With gradient accumulation or several processes
(``source="micro"``) each micro-batch's backward gives a G_small, the accumulated (and DDP
all-reduced) gradient the optimizer sees is G_big; with one process and one backward per step
(``source="auto"``: per-example norms) each example is a G_small, at B_small = 1 example or its
real label tokens (docs/science.md, "Where the two batch sizes come from"; two-batch estimator,
App. A.1).

Where it hooks into ``Trainer`` (transformers >= 4.46):

- a forward pre-hook on the model sees each training micro-batch's ``labels`` and the Trainer's
  ``num_items_in_batch`` (the real count of label tokens in the optimizer step, across devices
  when ``average_tokens_across_devices``);
- a gradient hook on the model's outputs queues an autograd-engine callback that runs when that
  backward has finished, re-queued once so it lands after DDP's end-of-backward all-reduce. It
  calls ``probe.micro_step`` and, on the micro-batch that ends the accumulation cycle
  (``accelerate``'s ``GradientState.sync_gradients``, set by the Trainer before the forward),
  ``probe.step``. That is before the Trainer clips (``_clip_grad_norm`` runs after
  ``training_step`` returns) and before accelerate un-scales fp16 gradients (the probe divides
  by the ``GradScaler``'s scale squared). No Trainer event fits: ``on_pre_optimizer_step`` runs
  after clipping.

Units (docs/science.md, "Pitfalls"): when the model receives ``num_items_in_batch`` its loss is
``sum(token losses) / N`` (times the world size with ``average_tokens_across_devices``), so the
backward of micro-batch j adds ``c_j g_j`` with ``c_j = n_j * s / N``, ``g_j`` the mean gradient
over its ``n_j`` real label tokens; the callback passes that ``c_j`` to the probe, so B_small and
B_big are real token counts (padding and ``-100`` labels excluded); per-example, it also passes
each example's real label tokens (``item_counts``). Otherwise the Trainer divides the model's
mean loss by the number of micro-batches ("mean/k").
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

# at run time, not only for type checkers: tools that read the signature's hints
# (``typing.get_type_hints``, LightningCLI's jsonargparse) resolve it; torch requires the package
from typing_extensions import Unpack

from noisescope._run import Run
from noisescope.torch import _deepspeed
from noisescope.torch._torch_api import queue_after_backward
from noisescope.torch._wrappers import detect

from ._base import _TrackingCallback
from ._branching import ModuleBranches, loss_output, unsupported
from ._options import CallbackOptions

#: The file in a Trainer checkpoint that names the run it belongs to (``on_save``).
RUN_FILE = "noisescope_run.json"

__all__ = ["HuggingFaceCallback"]


_IGNORE_INDEX = -100  # the label value Hugging Face losses skip


@dataclass
class _Micro:
    """One training forward: what its backward will need to tell the probe."""

    count: Tensor | float  # real items (label tokens or examples) in this micro-batch
    n_items: Tensor | float | None  # the Trainer's num_items_in_batch, if the model got it
    loss: Tensor | None
    #: per-example source in tokens: each example's real label tokens
    item_counts: Tensor | None = None
    queued: bool = False


def _first_tensor(value: Any) -> Tensor | None:
    if isinstance(value, Tensor):
        return value
    return None


class HuggingFaceCallback(_TrackingCallback, TrainerCallback):
    """Track the gradient noise scale of a ``transformers.Trainer`` run.

    Usage::

        trainer = Trainer(model, args, train_dataset=ds,
                          callbacks=[HuggingFaceCallback(project="lm", task="gpt2-small")])

    Two batch sizes per step come from ``gradient_accumulation_steps > 1`` and/or several DDP
    processes (micro-batches), or else, on one process with one backward per step, from
    per-example gradient norms (B_small = 1 example, or each example's real label tokens). Run
    name, config and batch size come from ``TrainingArguments``; the task defaults to the model
    type. It only observes: training is bit-identical without it.

    Args:
        run: an existing ``noisescope.Run`` to log to (not finished by the callback);
            by default one is created with ``noisescope.init`` on the first training step and
            finished at the end of training.
        **options: the keys of ``noisescope.integrations.CallbackOptions`` (one declaration for
            both callbacks); a key neither the callback nor ``noisescope.init`` takes raises a
            ``TypeError`` here:

            project, task, name, tags: passed to ``noisescope.init`` (name defaults to
                ``args.run_name`` or the output directory's name).
            units: "examples" or "tokens"; default: the units of ``run`` if given, else tokens
                when the labels have a sequence dimension (language modelling, token
                classification), else examples.
            layers: also log one series per layer (see ``GradientNoiseProbe``).
            every: measure every n-th optimizer step only.
            small_batches: "all" (each micro-batch's gradient is a G_small: most precise) or
                "first" (only the first micro-batch's: two gradient reads per step instead of
                one per micro-batch, and the per-parameter hooks only check a flag: the least
                overhead; tr(Sigma) gets noisier). See ``GradientNoiseProbe``.
            branch: opt in to branching (docs/branching.md), a
                ``noisescope.integrations.BranchOptions``: every N optimizer steps,
                ``noisescope.branch`` trains short continuations at batch sizes b, 2b, ... from
                the Trainer's state on its own train dataset and puts the state back (default
                loss: the model's own ``loss``; default store:
                ``<output_dir>/noisescope-branches``).
            any other ``noisescope.init`` argument (``url``, ``token``, ``mode``, ...): passed
                on.
    """

    def __init__(self, run: Run | None = None, **options: Unpack[CallbackOptions]) -> None:
        super().__init__(run, options)
        self._train_dataloader: Any = None
        self._branch_units = "examples"
        self._tokens_per_example = 1
        self._args: TrainingArguments | None = None
        self._state: TrainerState | None = None
        self._model: nn.Module | None = None
        self._ddp: nn.Module | None = None
        #: ``torch_compile=True``: the Trainer's compiled wrapper of the model, once called
        self._compiled: nn.Module | None = None
        self._expect_ddp = False
        self._optimizer: Any = None
        self._scheduler: Any = None
        self._gradient_state: Any = None
        self._shifts_labels = False
        self._handles: list[RemovableHandle] = []
        self._ddp_finder: RemovableHandle | None = None
        self._compiled_finder: RemovableHandle | None = None
        self._micro: _Micro | None = None
        self._n_items_cache: tuple[int, float] | None = None
        self._token_scale = 1.0
        self._world = 1
        self._units = "examples"  # the run's, once known (first training forward)

    # --- Trainer events ----------------------------------------------------------------------

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: nn.Module | None = None,
        optimizer: Any = None,
        lr_scheduler: Any = None,
        **kwargs: Any,
    ) -> None:
        """Install the model hooks; the run and probe start at the first training forward."""
        self._remove_hooks()
        self._compiled = None
        self._begin_training()
        self._args, self._state = args, state
        self._optimizer, self._scheduler = optimizer, lr_scheduler
        self._train_dataloader = kwargs.get("train_dataloader")
        if self._branch is not None:
            _check_branchable(args, model)
        if model is None:
            self._disable("the Trainer passed no model to the callback")
            return
        self._model = model
        if getattr(args, "deepspeed", None) or _truthy(os.environ.get("ACCELERATE_USE_DEEPSPEED")):
            raise _deepspeed.in_callback("Hugging Face")
        # FSDP1 (fsdp_config version 1: the Trainer hands over its wrapper) or a model sharded
        # in part: a TypeError naming what is supported, before any step is measured
        detect(model)
        if getattr(args, "n_gpu", 1) > 1:
            self._disable("nn.DataParallel (several GPUs in one process) is not supported; use DDP")
            return
        world = int(getattr(args, "world_size", 1) or 1)  # a property that asks accelerate
        self._expect_ddp = world > 1 and torch.distributed.is_initialized()
        # The Trainer multiplies sum/N losses by the world size when N counts every device.
        averaged = getattr(args, "average_tokens_across_devices", False)
        self._token_scale = float(max(world, 1)) if averaged else 1.0
        self._world = max(world, 1)
        try:
            from accelerate.state import GradientState  # type: ignore[import-untyped]

            self._gradient_state = GradientState()
        except ImportError:  # pragma: no cover - the Trainer itself needs accelerate
            self._gradient_state = None
        self._shifts_labels = _loss_shifts_labels(model)
        # first: under FSDP2 the probe is made before FSDP's own pre-hook unshards the
        # parameters, while they are still the DTensor shards it detects FSDP2 by
        self._handles.append(
            model.register_forward_pre_hook(self._before_forward, prepend=True, with_kwargs=True)
        )
        self._handles.append(model.register_forward_hook(self._after_forward, with_kwargs=True))
        if self._expect_ddp:
            self._ddp_finder = nn.modules.module.register_module_forward_pre_hook(
                self._find_ddp_wrapper
            )
        if getattr(args, "torch_compile", False):
            self._compiled_finder = nn.modules.module.register_module_forward_pre_hook(
                self._find_compiled_wrapper
            )

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """``branch=``: branch after the optimizer and scheduler steps of a branch step."""
        if self._branch is None:
            return
        examples = args.per_device_train_batch_size * args.gradient_accumulation_steps
        self._branch_at(
            int(state.global_step),
            batch_size=examples * self._tokens_per_example,
            lr=self._lr(),
            trainer=lambda: self._branch_trainer(args),
            default_root=args.output_dir or ".",
            units=self._branch_units,
        )

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Keep the run in the checkpoint just saved (``RUN_FILE``): a Trainer that resumes
        from it (``resume_from_checkpoint``) continues the run."""
        saved = self._saved_run()
        folder = os.path.join(args.output_dir or ".", f"checkpoint-{state.global_step}")
        if saved and state.is_world_process_zero and os.path.isdir(folder):
            with contextlib.suppress(OSError), open(os.path.join(folder, RUN_FILE), "w") as f:
                json.dump(saved, f)

    def _checkpoint_run(self, args: TrainingArguments, state: TrainerState) -> None:
        """Training that begins past step 0 resumed from the checkpoint of that step: the run
        ``on_save`` kept there, if any, is the one to continue."""
        if state.global_step <= 0:
            return
        folder = os.path.join(args.output_dir or ".", f"checkpoint-{state.global_step}")
        with contextlib.suppress(OSError, ValueError), open(os.path.join(folder, RUN_FILE)) as f:
            self._resume_from(json.load(f))

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Detach every hook; finish the run if the callback started it."""
        self._remove_hooks()
        self._end_training()

    # --- hooks -------------------------------------------------------------------------------

    def _find_ddp_wrapper(self, module: nn.Module, args: Any) -> None:
        """Global forward pre-hook, only until found: the DDP wrapper the Trainer built."""
        if isinstance(module, nn.parallel.DistributedDataParallel) and module.module is self._model:
            self._ddp = module

    def _find_compiled_wrapper(self, module: nn.Module, args: Any) -> None:
        """Global forward pre-hook, only until the first forward: the wrapper
        ``torch_compile=True`` built (``torch.compile`` of the model, or of its DDP wrapper).

        Its module call runs eagerly, the model's own call inside the compiled graph: the
        callback's hooks move from the model to the wrapper before the first trace, so dynamo
        never traces them (no graph break, no hook in the graph). The wrapper's pre-hooks for
        this call are already chosen, so one forward hook does both hooks' work.
        """
        orig = getattr(module, "_orig_mod", None)
        if orig is None or self._model is None:
            return
        ddp = orig if isinstance(orig, nn.parallel.DistributedDataParallel) else None
        if orig is not self._model and (ddp is None or ddp.module is not self._model):
            return
        self._remove_hooks()
        self._compiled, self._ddp = module, ddp
        self._handles.append(
            module.register_forward_hook(self._after_compiled_forward, with_kwargs=True)
        )

    def _after_compiled_forward(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> None:
        assert self._model is not None
        self._before_forward(self._model, args, kwargs)
        self._after_forward(module, args, kwargs, output)

    def _before_forward(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        if self._branching or self._disabled is not None:
            return
        if not (module.training and torch.is_grad_enabled()):
            return
        with self._or_disable("could not read the micro-batch"):
            labels = _first_tensor(kwargs.get("shift_labels"))
            shifted = labels is not None
            if labels is None:
                labels = _first_tensor(kwargs.get("labels"))
            if labels is None:
                self._disable(
                    "the model's forward got no `labels` (a custom compute_loss_func or label "
                    "smoothing pops them), so the micro-batch sizes are unknown"
                )
                return
            if self.probe is None:
                self._start(module, labels)
            if self._shifts_labels and not shifted and labels.dim() >= 2:
                labels = labels[..., 1:]  # causal LM: the last position predicts nothing
            count: Tensor | float
            item_counts: Tensor | None = None
            if labels.is_floating_point():  # regression / multi-label targets: one per example
                count = float(labels.shape[0])
            else:
                real = labels.ne(_IGNORE_INDEX)
                count = real.sum()
                if self._units == "tokens" and labels.dim() >= 2 and self._per_example_now():
                    item_counts = real.flatten(1).sum(1)  # B_small: each example's tokens
            self._micro = _Micro(count, kwargs.get("num_items_in_batch"), None, item_counts)

    def _after_forward(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> None:
        micro, self._micro = self._micro, None
        if micro is None or self._disabled is not None:
            return
        loss = output.get("loss") if isinstance(output, Mapping) else None
        if isinstance(loss, Tensor):
            micro.loss = loss.detach()
        if isinstance(loss, Tensor) and loss.grad_fn is not None:
            tensors = [loss]  # the Trainer backpropagates the model's own loss
        else:  # a loss computed outside the model still flows back through its outputs
            values = output.values() if isinstance(output, Mapping) else output
            if isinstance(values, Tensor):
                values = [values]
            tensors = [v for v in values if isinstance(v, Tensor) and v.grad_fn is not None]

        def on_grad(grad: Tensor) -> None:
            if not micro.queued:
                micro.queued = True
                queue_after_backward(lambda: self._after_backward(micro))

        for tensor in tensors:
            tensor.register_hook(on_grad)

    def _after_backward(self, micro: _Micro) -> None:
        """End of one micro-batch's backward (after DDP's all-reduce): feed the probe."""
        probe = self.probe
        if probe is None or self._disabled is not None:
            return
        with self._or_disable("measurement failed"):
            count = float(micro.count)
            if count > 0:  # a micro-batch whose labels are all ignored adds nothing
                grad_scale = None
                if micro.n_items is not None:
                    # loss = sum / N (x world with average_tokens_across_devices): c_j = n_j s / N
                    grad_scale = count * self._token_scale / self._n_items(micro.n_items)
                probe.micro_step(
                    batch_size=count, grad_scale=grad_scale, item_counts=micro.item_counts
                )
                if micro.loss is not None:
                    loss_sum = self._loss_sum
                    self._loss_sum = micro.loss if loss_sum is None else loss_sum + micro.loss
                self._n_micro += 1
            else:
                self._discard_backward()
            sync = True if self._gradient_state is None else self._gradient_state.sync_gradients
            if sync and self._n_micro > 0:
                self._step(micro)

    def _step(self, micro: _Micro) -> None:
        assert self.probe is not None
        loss: float | None = None
        if self._loss_sum is not None:
            total = float(self._loss_sum)
            # sum/N losses add up to the step's mean; plain mean losses are averaged
            summed = micro.n_items is not None
            loss = total * self._token_scale if summed else total / self._n_micro
        self._loss_sum, self._n_micro = None, 0
        self.probe.step(loss=loss, lr=self._lr())

    # --- helpers -----------------------------------------------------------------------------

    def _branch_trainer(self, args: TrainingArguments) -> ModuleBranches:
        """What branching needs, from what the Trainer handed the callback."""
        options, loader = self._branch, self._train_dataloader
        assert options is not None
        if self._model is None or self._optimizer is None or loader is None:
            raise RuntimeError(
                "noisescope: branching needs the Trainer's model, optimizer and train "
                "dataloader, and the Trainer passed none to the callback"
            )
        return ModuleBranches(
            self._model,
            self._optimizer,
            [] if self._scheduler is None else [self._scheduler],
            loader.dataset,
            loader.collate_fn,
            options.loss or (lambda model, batch: loss_output(model(**batch))),
            options.eval,
            micro_batch_size=args.per_device_train_batch_size,
            max_grad_norm=args.max_grad_norm or None,
            items_per_example=self._tokens_per_example,
        )

    def _start(self, module: nn.Module, labels: Tensor) -> None:
        """First training forward: the units are known now; start the run and the probe."""
        args, state = self._args, self._state
        assert args is not None
        assert state is not None
        run_units = getattr(self.run, "units", None)  # a run passed in fixes the units
        units = self.units or run_units or ("tokens" if labels.dim() >= 2 else "examples")
        self._units = units
        # branch batch sizes in the run's units: nominal tokens (full-length sequences)
        self._branch_units = units
        if units == "tokens" and labels.dim() >= 2:
            self._tokens_per_example = int(labels.shape[-1]) - (1 if self._shifts_labels else 0)
        if self._expect_ddp and self._ddp is None and not detect(module).sharded:
            warnings.warn(
                "noisescope: several processes but no DistributedDataParallel wrapper found; "
                "measuring each process on its own",
                stacklevel=2,
            )
        self._remove_finders()  # only needed until the first forward
        run = self.run
        if run is None:
            self._checkpoint_run(args, state)
            run = self._init_run(**self._run_defaults(args, module, units, labels))
        wrapper = self._compiled if self._compiled is not None else self._ddp
        # one backward per step on one process: per-example norms ("auto"), else micro-batches
        several = (
            args.gradient_accumulation_steps > 1
            or self._world > 1
            or self._ddp is not None
            or detect(module).sharded
        )
        if self._compiled is not None and not several:
            # the compiled wrapper is found after its first forward, and the per-example
            # hooks must be in place before the forward that dynamo traces
            self._disable(
                "torch_compile=True on one process with gradient_accumulation_steps=1: the "
                "callback measures this setup with per-example norms, which it cannot attach to "
                "an already compiled model; set gradient_accumulation_steps > 1 (or drop "
                "torch_compile)"
            )
            return
        self._attach_probe(
            wrapper if wrapper is not None else module,
            run,
            units=units,
            micro_loss="mean/k",  # used when the model gets no num_items_in_batch
            scaler=getattr(self._optimizer, "scaler", None),
            step=int(state.global_step),
            several=several,
            accumulate="set gradient_accumulation_steps > 1",
        )

    def _run_defaults(
        self, args: TrainingArguments, module: nn.Module, units: str, labels: Tensor
    ) -> dict[str, Any]:
        """What ``TrainingArguments`` and the model say about the run (``noisescope.init``)."""
        world = int(getattr(args, "world_size", 1) or 1)
        examples_per_step = (
            args.per_device_train_batch_size * args.gradient_accumulation_steps * world
        )
        batch_size: float = float(examples_per_step)
        if units == "tokens" and labels.dim() >= 2:  # nominal: full-length sequences
            batch_size *= float(labels.shape[-1] - (1 if self._shifts_labels else 0))
        config: dict[str, Any] = {"training_args": args.to_sanitized_dict()}
        model_config = getattr(module, "config", None)
        if model_config is not None and hasattr(model_config, "to_diff_dict"):
            config["model_config"] = model_config.to_diff_dict()
        config["examples_per_step"] = examples_per_step
        name = self.name or args.run_name
        if not name and args.output_dir:
            name = os.path.basename(os.path.normpath(args.output_dir))
        task = self.task or getattr(model_config, "model_type", None) or type(module).__name__
        return {
            "task": task,
            "name": name or None,
            "config": config,
            "batch_size": batch_size,
            "units": units,
        }

    def _n_items(self, n_items: Tensor | float) -> float:
        key = id(n_items)  # the Trainer passes one object to every micro-batch of a step
        if self._n_items_cache is not None and self._n_items_cache[0] == key:
            return self._n_items_cache[1]
        value = float(n_items)
        self._n_items_cache = (key, value)
        return value

    def _lr(self) -> float | None:
        try:
            if self._scheduler is not None:
                return float(self._scheduler.get_last_lr()[0])
            if self._optimizer is not None:
                return float(self._optimizer.param_groups[0]["lr"])
        except Exception:
            return None
        return None

    def _remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._remove_finders()

    def _remove_finders(self) -> None:
        for finder in (self._ddp_finder, self._compiled_finder):
            if finder is not None:
                finder.remove()
        self._ddp_finder = self._compiled_finder = None


def _truthy(flag: str | None) -> bool:
    """Accelerate's boolean environment flags ("true", "1", "yes")."""
    return (flag or "").strip().lower() in ("1", "true", "yes")


def _check_branchable(args: TrainingArguments, model: nn.Module | None) -> None:
    """``branch=`` on a setup it cannot branch: say so before training starts."""
    world = int(getattr(args, "world_size", 1) or 1)
    if world > 1:
        raise unsupported(f"a Trainer on {world} processes")
    if getattr(args, "n_gpu", 1) > 1:
        raise unsupported("nn.DataParallel (several GPUs in one process)")
    if getattr(args, "fsdp", None) or getattr(args, "deepspeed", None):
        raise unsupported("under FSDP or DeepSpeed")
    if args.fp16 or args.bf16:
        raise unsupported("with fp16/bf16 mixed precision (its autocast and loss scaling)")
    if model is not None and detect(model).sharded:
        raise unsupported("a sharded (fully_shard) model")


def _loss_shifts_labels(model: nn.Module) -> bool:
    """Whether the model's loss shifts labels by one (causal LM), so position 0 counts for nothing.

    Asks the loss the model actually uses (``PreTrainedModel.loss_function``, which falls back to
    the causal-LM loss when ``loss_type`` is unset): the Trainer's own count looks only at
    ``loss_type`` and then over-counts by one token per sequence for models such as
    ``GPT2LMHeadModel``; the callback follows the loss, and ``c_j = n_j s / N`` absorbs the
    Trainer's ``N`` whatever it counted.
    """
    config = getattr(model, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        return False
    try:
        from transformers.loss.loss_utils import ForCausalLMLoss
    except ImportError:  # pragma: no cover - older transformers
        return type(model).__name__.endswith(("ForCausalLM", "LMHeadModel"))
    try:
        loss_function = getattr(model, "loss_function", None)
    except Exception:
        return False
    return loss_function is ForCausalLMLoss
