"""Train a LightningModule on scikit-learn's bundled digits and track its gradient noise scale.

Start the server and dashboard first (``noisescope up``), then::

    pip install 'noisescope[lightning]' scikit-learn
    python examples/lightning_module.py                   # 4 micro-batches of 16: B = 16 / 64
    python examples/lightning_module.py --devices 2       # DDP on 2 CPU processes (gloo)

The data ships inside scikit-learn (1,797 8x8 images), so nothing is downloaded. The
accumulated micro-batches (and, under DDP, each process's share) give the two batch sizes the
noise-scale estimator needs at no extra compute.
"""

from __future__ import annotations

import argparse
from typing import Any

import lightning.pytorch as pl
import torch
from sklearn.datasets import load_digits
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from noisescope.integrations import LightningCallback


class DigitsMLP(pl.LightningModule):
    def __init__(self, lr: float = 0.05, hidden: int = 128) -> None:
        super().__init__()
        self.save_hyperparameters()  # becomes the noisescope run's config
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)  # mean over the micro-batch
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams["lr"], momentum=0.9)


def digits_loader(micro_batch: int) -> DataLoader[Any]:
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    return DataLoader(TensorDataset(x, y), batch_size=micro_batch, shuffle=True, drop_last=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--url", default=None, help="server URL (default: $NOISESCOPE_URL or local)"
    )
    parser.add_argument("--project", default="examples")
    parser.add_argument("--name", default=None)
    parser.add_argument("--micro-batch", type=int, default=16, help="examples per micro-batch")
    parser.add_argument("--accumulation", type=int, default=4, help="micro-batches per step")
    parser.add_argument("--devices", type=int, default=1, help="> 1: DDP on CPU processes")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--mode", default=None, help="online (default), offline or disabled")
    args = parser.parse_args(argv)

    pl.seed_everything(0)
    callback = LightningCallback(
        project=args.project,
        task="digits-mlp",
        name=args.name or f"mb{args.micro_batch}-k{args.accumulation}-d{args.devices}",
        url=args.url,  # url and mode None: $NOISESCOPE_URL / $NOISESCOPE_MODE or the defaults
        mode=args.mode,
    )
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        accumulate_grad_batches=args.accumulation,
        gradient_clip_val=1.0,  # noisescope measures before this clipping
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        logger=False,
        enable_checkpointing=False,
        callbacks=[callback],
    )
    trainer.fit(DigitsMLP(lr=args.lr), digits_loader(args.micro_batch))
    if callback.run is not None and trainer.global_rank == 0:
        print(f"noisescope run {callback.run.id}: {callback.run.status().line()}")


if __name__ == "__main__":
    main()
