"""Opt-in branching from the framework callbacks (``branch=BranchOptions(every=N, ...)``;
docs/branching.md).

The callback knows the model, optimizer, scheduler, train dataset and collate function, the
parent's batch size, learning rate and gradient clipping; the user adds the evaluation batches
(and, if the model's own loss is not it, the loss). From those, :class:`ModuleBranches` is the
``noisescope.branch.Branchable`` that ``noisescope.branch.Every`` branches with: planning,
running, the store that makes a killed sweep resume, and the branch runs linked to the parent
are all ``noisescope.branch``'s.
"""

from __future__ import annotations

import copy
import os
import random
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from noisescope import branch
from noisescope._run import Run

from ._options import BranchOptions

#: What the callbacks can branch (named in the errors for what they cannot).
SUPPORTED = (
    "one process on one device (no DDP, FSDP, DeepSpeed or nn.DataParallel), automatic "
    "optimization with one optimizer, no mixed-precision autocast (fp32, bf16-true, ...)"
)

LossFn = Callable[[nn.Module, Any], Tensor]


def unsupported(what: str) -> RuntimeError:
    return RuntimeError(f"noisescope: branching cannot branch {what}; it supports {SUPPORTED}")


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, Tensor):
        return batch.to(device)
    if isinstance(batch, Mapping):
        return type(batch)({k: _to_device(v, device) for k, v in batch.items()})  # type: ignore[call-arg]
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(v, device) for v in batch)
    return batch


def _rng_state() -> dict[str, Any]:
    import numpy as np

    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: Mapping[str, Any]) -> None:
    import numpy as np

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


class ModuleBranches:
    """A ``Branchable`` over a torch model trained by a framework.

    ``save``/``restore``: the model's and optimizer's state dicts, the schedulers', the
    gradients, the training mode and the torch/CUDA/Python/NumPy RNGs (copies). ``train``: a
    plain loop over the framework's train dataset, seed ``branch.seed`` drawing the same
    example order at every batch size (paired seeds), each step of ``branch.batch_size``
    examples (nominal tokens when ``items_per_example`` > 1) in micro-batches of the parent's
    size (losses weighted by examples), every parameter group's lr scaled by ``branch.lr`` /
    the parent's, the parent's clipping; the schedulers do not step. ``evaluate``: the mean
    loss over ``eval_batches`` in eval mode.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        schedulers: list[Any],
        dataset: Any,
        collate_fn: Callable[[list[Any]], Any],
        loss_fn: LossFn,
        eval_batches: Iterable[Any],
        *,
        micro_batch_size: int,
        max_grad_norm: float | None,
        to_device: Callable[[Any], Any] | None = None,
        items_per_example: int = 1,
    ) -> None:
        if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            raise unsupported(
                f"from a train dataset without __len__ and __getitem__ ({type(dataset).__name__}:"
                " an IterableDataset cannot be re-drawn per seed)"
            )
        self.model = model
        self.optimizer = optimizer
        self.schedulers = schedulers
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.loss_fn = loss_fn
        self.eval_batches = eval_batches
        self.micro_batch_size = max(int(micro_batch_size), 1)
        self.max_grad_norm = max_grad_norm
        self.items_per_example = max(int(items_per_example), 1)
        device = next(model.parameters()).device
        self.to_device = to_device or (lambda batch: _to_device(batch, device))

    def save(self) -> Any:
        return copy.deepcopy(
            {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "schedulers": [s.state_dict() for s in self.schedulers],
                "grads": [p.grad for p in self.model.parameters()],
                "training": self.model.training,
                "rng": _rng_state(),
            }
        )

    def restore(self, state: Any) -> None:
        state = copy.deepcopy(state)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        for scheduler, scheduler_state in zip(self.schedulers, state["schedulers"], strict=True):
            scheduler.load_state_dict(scheduler_state)
        for p, grad in zip(self.model.parameters(), state["grads"], strict=True):
            p.grad = grad
        self.model.train(state["training"])
        _set_rng_state(state["rng"])

    def train(self, b: branch.Branch, run: Run | None) -> None:
        # the plan counts the run's units: nominal tokens are examples x tokens per example
        per_step = max(b.batch_size // self.items_per_example, 1)
        gen = torch.Generator().manual_seed(b.seed)
        n = len(self.dataset)
        n_draws = -(-(b.steps * per_step) // n)
        order = torch.cat([torch.randperm(n, generator=gen) for _ in range(n_draws)])
        torch.manual_seed(b.seed)  # dropout: the RNGs are the parent's again after restore()
        ratio = b.lr / float(self.optimizer.param_groups[0]["lr"])
        for group in self.optimizer.param_groups:
            group["lr"] = float(group["lr"]) * ratio
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.model.train()
        for i in range(b.steps):
            self.optimizer.zero_grad(set_to_none=True)
            step_loss = 0.0
            idx = order[i * per_step : (i + 1) * per_step].tolist()
            for j in range(0, len(idx), self.micro_batch_size):
                chunk = idx[j : j + self.micro_batch_size]
                batch = self.to_device(self.collate_fn([self.dataset[k] for k in chunk]))
                loss = self.loss_fn(self.model, batch) * (len(chunk) / len(idx))
                loss.backward()
                step_loss += float(loss.detach())
            if self.max_grad_norm:
                nn.utils.clip_grad_norm_(params, self.max_grad_norm)
            self.optimizer.step()
            if run is not None:
                run.log(step=i + 1, loss=step_loss, lr=b.lr, examples=(i + 1) * b.batch_size)
        self.optimizer.zero_grad(set_to_none=True)

    def evaluate(self) -> float:
        training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                losses = [
                    float(self.loss_fn(self.model, self.to_device(batch)))
                    for batch in self.eval_batches
                ]
        finally:
            self.model.train(training)
        if not losses:
            raise ValueError("BranchOptions.eval holds no batches")
        return sum(losses) / len(losses)


def loss_output(output: Any) -> Tensor:
    """The loss in a model's or ``training_step``'s output (a tensor, or its ``"loss"``)."""
    loss = output.get("loss") if isinstance(output, Mapping) else output
    if not isinstance(loss, Tensor):
        raise TypeError(
            f"the branch loss must be a tensor or hold one under 'loss', got {type(output)}: "
            "pass BranchOptions(loss=lambda model, batch: ...)"
        )
    return loss


def log_to(run: Run | None, init_kwargs: Mapping[str, Any]) -> branch.LogTo | None:
    """Branch runs go where the parent's does, with the parent's client settings."""
    if run is None or not run.active:
        return None
    keep = ("token", "mode", "dir", "quiet", "flush_timeout", "dashboard_url", "transport")
    kwargs = {k: v for k, v in init_kwargs.items() if k in keep}
    url = init_kwargs.get("url") or getattr(run.settings, "url", None)
    return branch.LogTo(run.project, run.task, url=url, name=run.name, init_kwargs=kwargs)


def store_for(
    options: BranchOptions, default_root: str | os.PathLike[str], run: Run | None
) -> Path:
    """Branch points of one run under one folder: the same run (``run_id``) resumes its sweeps."""
    root = (
        Path(options.store)
        if options.store is not None
        else Path(default_root) / "noisescope-branches"
    )
    return root / (run.id if run is not None else "no-run")
