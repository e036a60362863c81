"""PyTorch Lightning integration: a ``Callback`` that tracks the gradient noise scale.

A thin layer over the plain-loop API: ``noisescope.init`` plus
``noisescope.torch.GradientNoiseProbe``. With accumulation or several processes
(``source="micro"``) each micro-batch's backward gives a G_small, the gradient the optimizer
sees (accumulated over ``accumulate_grad_batches``, all-reduced by the DDP strategy) is G_big;
with one process and ``accumulate_grad_batches=1`` (``source="auto"``: per-example norms) each
example is a G_small (docs/science.md, "Where the two batch sizes come from").

Where it hooks in (automatic optimization, Lightning 2.x): ``on_after_backward`` runs after each
backward, when DDP has all-reduced the last micro-batch's gradient, and, for that last
micro-batch, inside the optimizer closure: before the AMP plugin un-scales the gradients and
before ``on_before_optimizer_step`` and gradient clipping. The probe's step is taken there, so
the norms are pre-clipping and the probe divides out the ``GradScaler``'s scale. Lightning
divides ``training_step``'s loss by ``accumulate_grad_batches`` (K) on every micro-batch, so a
backward adds ``c_j g_j`` with ``c_j = 1/K`` for a mean-reduced loss (``b_j/K`` for a summed one);
the callback passes ``c_j`` to the probe, which is exact even for a short last cycle.

Manual optimization: steps are closed in ``on_before_optimizer_step`` (the probe's
``micro_loss`` convention applies); with fp16 AMP the gradients are already un-scaled there, so
those steps are not measured.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy, SingleDeviceStrategy
from lightning.pytorch.utilities.data import extract_batch_size
from torch import Tensor, nn

# at run time, not only for type checkers: tools that read the signature's hints
# (``typing.get_type_hints``, LightningCLI's jsonargparse) resolve it; torch requires the package
from typing_extensions import Unpack

from noisescope._run import Run
from noisescope.torch import _deepspeed
from noisescope.torch._wrappers import fsdp1_refused

from ._base import _TrackingCallback
from ._branching import ModuleBranches, loss_output, unsupported
from ._options import CallbackOptions

__all__ = ["LightningCallback"]


class LightningCallback(_TrackingCallback, pl.Callback):
    """Track the gradient noise scale of a ``lightning.pytorch.Trainer`` fit.

    Usage::

        trainer = L.Trainer(accumulate_grad_batches=4,
                            callbacks=[LightningCallback(project="digits", task="mlp")])

    Two batch sizes per step come from ``accumulate_grad_batches > 1`` and/or the DDP strategy
    on several devices (micro-batches), or else, on one process with one backward per step, from
    per-example gradient norms (B_small = 1 example, or each example's tokens). It only
    observes: training is bit-identical without it.

    Args:
        run: an existing ``noisescope.Run`` (not finished by the callback); by default one is
            created on the first training batch and finished when training ends.
        batch_size_fn: items in a micro-batch, a number or one count per example (e.g. real
            tokens: ``lambda b: (b["labels"][:, 1:] != -100).sum(1)``); default: Lightning's
            ``extract_batch_size`` (examples). In tokens on one process without accumulation
            (per-example norms) it must give one count per example.
        loss_reduction: how ``training_step``'s loss is reduced over the micro-batch's items:
            "mean" (the default) or "sum".
        micro_loss: the probe's convention for manual optimization (see ``GradientNoiseProbe``).
        **options: the keys of ``noisescope.integrations.CallbackOptions``, as for
            ``HuggingFaceCallback``:

            project, task, name, tags: passed to ``noisescope.init`` (task defaults to the
                LightningModule's class name; config to its ``hparams``).
            units: "examples" or "tokens", what ``batch_size_fn`` counts (default: the units of
                ``run`` if given, else examples).
            layers, every, small_batches: as for ``HuggingFaceCallback`` (the probe's per-layer
                series, its cadence and which micro-batches it reads).
            branch: opt-in branching every N optimizer steps, a
                ``noisescope.integrations.BranchOptions``, as for ``HuggingFaceCallback`` (default
                loss: ``training_step(batch, 0)``, its tensor or its ``"loss"``; default store:
                ``<default_root_dir>/noisescope-branches``).
            any other ``noisescope.init`` argument: passed on.
    """

    def __init__(
        self,
        run: Run | None = None,
        *,
        batch_size_fn: Callable[[Any], float | int | Tensor] | None = None,
        loss_reduction: str = "mean",
        micro_loss: str = "mean/k",
        **options: Unpack[CallbackOptions],
    ) -> None:
        if options.get("units") is None:  # a run passed in fixes the units
            options["units"] = getattr(run, "units", None) or "examples"
        if loss_reduction not in ("mean", "sum"):
            raise ValueError(f"loss_reduction must be 'mean' or 'sum', got {loss_reduction!r}")
        super().__init__(run, options)
        self._optimizer_steps = 0  # trainer.global_step at the last batch end
        self.batch_size_fn = batch_size_fn
        self.loss_reduction = loss_reduction
        self.micro_loss = micro_loss
        self._batch_items: float | None = None
        self._item_counts: Tensor | None = None  # tokens, per-example: each example's count
        self._loss: Tensor | None = None

    # --- Lightning hooks ---------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Kept in the checkpoint: the run, which ``fit(ckpt_path=...)`` continues."""
        return self._saved_run()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """``fit(ckpt_path=...)``: the run this callback starts continues the checkpoint's
        (``noisescope.init(run_id=..., resume=True)``)."""
        self._resume_from(state_dict)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if isinstance(trainer.strategy, DeepSpeedStrategy):
            raise _deepspeed.in_callback("Lightning")
        if isinstance(trainer.strategy, FSDPStrategy):  # FSDP1: before any step is measured
            raise fsdp1_refused()
        self._begin_training()
        self._optimizer_steps = int(trainer.global_step)
        if self._branch is not None:
            _check_branchable(trainer, pl_module)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._disabled is not None:
            return
        with self._or_disable("could not read the micro-batch"):
            fn = self.batch_size_fn or extract_batch_size
            items = fn(batch)
            counts: Tensor | None = None
            if not isinstance(items, (int, float)) and torch.as_tensor(items).dim() > 0:
                counts = torch.as_tensor(items).flatten()  # one count per example
                items = counts.sum()
            self._batch_items = float(items)
            if self.probe is None:
                self._start(trainer, pl_module, self._batch_items)
            self._item_counts = None
            if self.units == "tokens" and self._per_example_now():
                if counts is None:
                    self._disable(
                        "units='tokens' on one process with one backward per step are measured "
                        "per example, which needs each example's token count: make "
                        "batch_size_fn return one count per example (e.g. "
                        "`(batch['labels'][:, 1:] != -100).sum(1)`)"
                    )
                    return
                self._item_counts = counts

    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Tensor
    ) -> None:
        self._loss = loss.detach()

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        probe, items = self.probe, self._batch_items
        if probe is None or items is None or self._disabled is not None:
            return
        with self._or_disable("measurement failed"):
            automatic = pl_module.automatic_optimization
            k = float(trainer.accumulate_grad_batches)
            counts, self._item_counts = self._item_counts, None
            if automatic:
                # Lightning backpropagates training_step's loss / K: c_j = 1/K (mean) or b_j/K
                grad_scale = (items if self.loss_reduction == "sum" else 1.0) / k
                probe.micro_step(batch_size=items, grad_scale=grad_scale, item_counts=counts)
            else:
                probe.micro_step(batch_size=items, item_counts=counts)
            self._n_micro += 1
            if self._loss is not None:
                loss = self._loss * k if automatic else self._loss
                self._loss_sum = loss if self._loss_sum is None else self._loss_sum + loss
            self._batch_items = None
            if automatic and not _accumulating(trainer):
                self._step(trainer)

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any
    ) -> None:
        """Manual optimization only: close the step (automatic steps closed after backward)."""
        if self.probe is None or self._n_micro == 0 or self._disabled is not None:
            return
        scaler = getattr(trainer.strategy.precision_plugin, "scaler", None)
        if scaler is not None and scaler.is_enabled():
            self._disable("manual optimization with fp16 AMP: gradients are un-scaled here")
            return
        with self._or_disable("measurement failed"):
            self._step(trainer)

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """``branch=``: branch after the optimizer (and step-interval schedulers) of a
        branch step have stepped."""
        step = int(trainer.global_step)
        if self._branch is None or step == self._optimizer_steps:
            return  # no optimizer step in this batch (accumulating)
        self._optimizer_steps = step
        loader = trainer.train_dataloader
        micro = int(getattr(loader, "batch_size", None) or extract_batch_size(batch))
        examples = micro * int(trainer.accumulate_grad_batches)
        per_example = 1  # tokens: the run's nominal batch size (first micro-batch's count)
        nominal = getattr(self.run, "batch_size", None)
        if self.units == "tokens" and nominal:
            per_example = max(round(float(nominal) / examples), 1)
        self._branch_at(
            step,
            batch_size=examples * per_example,
            lr=float(trainer.optimizers[0].param_groups[0]["lr"]),
            trainer=lambda: self._branch_trainer(trainer, pl_module, micro, per_example),
            default_root=str(trainer.default_root_dir),
            units=self.units or "examples",
        )

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._end_training()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._end_training("failed")

    # --- helpers -----------------------------------------------------------------------------

    def _branch_trainer(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, micro: int, per_example: int
    ) -> ModuleBranches:
        """What branching needs, from the Trainer: optimizer, schedulers, train data, clipping."""
        options, loader = self._branch, trainer.train_dataloader
        assert options is not None
        if not isinstance(loader, torch.utils.data.DataLoader):
            raise unsupported(f"from a {type(loader).__name__} (one DataLoader is supported)")
        return ModuleBranches(
            pl_module,
            trainer.optimizers[0],
            [config.scheduler for config in trainer.lr_scheduler_configs],
            loader.dataset,
            loader.collate_fn,
            options.loss or (lambda _, batch: loss_output(pl_module.training_step(batch, 0))),
            options.eval,
            micro_batch_size=micro,
            max_grad_norm=float(trainer.gradient_clip_val or 0) or None,
            to_device=trainer.strategy.batch_to_device,
            items_per_example=per_example,
        )

    def _step(self, trainer: pl.Trainer) -> None:
        assert self.probe is not None
        loss = None
        if self._loss_sum is not None:
            loss = float(self._loss_sum) / self._n_micro
        self._loss_sum, self._n_micro = None, 0
        lr: float | None = None
        if trainer.optimizers:
            lr = float(trainer.optimizers[0].param_groups[0]["lr"])
        self.probe.step(loss=loss, lr=lr)

    def _start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, items: float) -> None:
        """First training batch: start the run (on every rank; only rank 0 sends) and probe."""
        model = trainer.strategy.model  # the DDP wrapper under the DDP strategy
        ddp = isinstance(model, nn.parallel.DistributedDataParallel)
        if model is None or not (ddp and torch.distributed.is_initialized()):
            model = pl_module
        run = self.run
        if run is None:
            k = int(trainer.accumulate_grad_batches)
            world = int(trainer.world_size)
            config: dict[str, Any] = {"hparams": dict(pl_module.hparams)}
            config["trainer"] = {
                "accumulate_grad_batches": k,
                "world_size": world,
                "precision": str(trainer.precision),
                "max_steps": trainer.max_steps,
                "max_epochs": trainer.max_epochs,
                "gradient_clip_val": trainer.gradient_clip_val,
                "strategy": type(trainer.strategy).__name__,
            }
            run = self._init_run(
                task=self.task or type(pl_module).__name__,
                name=self.name,
                config=config,
                batch_size=items * k * world,  # nominal: the first micro-batch's size
                units=self.units,
                rank=int(trainer.global_rank),
                world_size=world,
            )
        self._attach_probe(
            model,
            run,
            units=self.units or "examples",
            micro_loss=self.micro_loss,
            scaler=getattr(trainer.strategy.precision_plugin, "scaler", None),
            step=int(trainer.global_step),
            several=int(trainer.accumulate_grad_batches) > 1 or int(trainer.world_size) > 1,
            accumulate="set accumulate_grad_batches > 1",
        )


def _check_branchable(trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
    """``branch=`` on a setup it cannot branch: say so before training starts."""
    if trainer.world_size > 1 or not isinstance(trainer.strategy, SingleDeviceStrategy):
        strategy = type(trainer.strategy).__name__
        raise unsupported(f"under {strategy} on {trainer.world_size} process(es)")
    if not pl_module.automatic_optimization or len(trainer.optimizers) != 1:
        raise unsupported("manual optimization or several optimizers")
    if "mixed" in str(trainer.precision):
        raise unsupported(f"with precision={trainer.precision!r} (autocast)")
    if trainer.gradient_clip_val and trainer.gradient_clip_algorithm not in (None, "norm"):
        raise unsupported(f"with gradient_clip_algorithm={trainer.gradient_clip_algorithm!r}")


def _accumulating(trainer: pl.Trainer) -> bool:
    """Whether the optimizer will *not* step after the current batch (Lightning's own rule)."""
    epoch_loop = trainer.fit_loop.epoch_loop
    should_accumulate = getattr(epoch_loop, "_should_accumulate", None)
    if should_accumulate is not None:
        return bool(should_accumulate())
    # fallback for a Lightning without the private helper: the public counters
    progress = epoch_loop.batch_progress.current.ready
    k = int(trainer.accumulate_grad_batches)
    last = progress == trainer.num_training_batches or epoch_loop.batch_progress.is_last_batch
    return progress % k != 0 and not last
