"""A small LightningModule on scikit-learn's bundled digits, for the Lightning callback tests.

It records, in its own ``on_before_optimizer_step`` (called after the callbacks' and before
Lightning clips), the squared norm of the gradient the optimizer is about to use: an independent
reading of |G_big|^2 to check the callback's measurement against.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from sklearn.datasets import load_digits
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from harness import QUIET_LIGHTNING
from noisescope.integrations import LightningCallback


def digits_loader(batch_size: int, n: int = 512, shuffle: bool = False) -> DataLoader[Any]:
    digits = load_digits()
    x = torch.tensor(digits.data[:n], dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target[:n], dtype=torch.long)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=shuffle)


class DigitsMLP(pl.LightningModule):
    def __init__(self, lr: float = 0.05, hidden: int = 32) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))
        self.big_norms_sq: list[float] = []

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        self.big_norms_sq.append(float(sum(g.double().square().sum() for g in grads)))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams["lr"], momentum=0.9)


def fit_on_two_ranks(
    module_class: type[DigitsMLP], *, task: str, strategy: Any, gradient_clip_val: float | None
) -> None:
    """The 2-process scripts' body: ``argv`` is ``SERVER_URL OUT_JSON``; 3 steps of 2 micro-batches
    of 8 per rank, then rank 0 writes its run id and the |G_big|^2 its module recorded."""
    url, out = sys.argv[1], Path(sys.argv[2])
    torch.set_num_threads(1)
    torch.manual_seed(0)
    module = module_class()
    callback = LightningCallback(project="integrations", task=task, url=url, quiet=True)
    trainer = pl.Trainer(
        max_steps=3,
        accumulate_grad_batches=2,
        gradient_clip_val=gradient_clip_val,
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        callbacks=[callback],
        **QUIET_LIGHTNING,
    )
    trainer.fit(module, digits_loader(8, n=256))
    if trainer.global_rank == 0:
        assert callback.run is not None
        out.write_text(json.dumps({"run_id": callback.run.id, "big_norms_sq": module.big_norms_sq}))
