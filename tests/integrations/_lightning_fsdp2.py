"""Lightning's ModelParallelStrategy (FSDP2, ``fully_shard``) on 2 CPU processes (gloo) with the
noisescope callback; run as a script.

``python _lightning_fsdp2.py SERVER_URL OUT_JSON``: Lightning re-launches this script for rank
1. Rank 0 writes its run id and the |G_big|^2 its module read before clipping (the shards'
squared norms summed over the ranks).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed.fsdp import fully_shard

from noisescope.integrations import LightningCallback
from tests.integrations._lit import DigitsMLP, digits_loader


class ShardedDigits(DigitsMLP):
    def configure_model(self) -> None:
        mesh = self.device_mesh["data_parallel"]
        for layer in self.net:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(self.net, mesh=mesh)

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        local = torch.zeros((), dtype=torch.float64)
        for p in self.parameters():
            if p.grad is not None:
                local += p.grad.to_local().double().square().sum()  # type: ignore[attr-defined]
        dist.all_reduce(local)
        self.big_norms_sq.append(float(local))


def main() -> None:
    url, out = sys.argv[1], Path(sys.argv[2])
    torch.set_num_threads(1)
    torch.manual_seed(0)
    module = ShardedDigits()
    callback = LightningCallback(project="integrations", task="digits-fsdp2", url=url, quiet=True)
    trainer = pl.Trainer(
        max_steps=3,
        accumulate_grad_batches=2,
        gradient_clip_val=None,
        accelerator="cpu",
        devices=2,
        strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
    )
    trainer.fit(module, digits_loader(8, n=256))
    if trainer.global_rank == 0:
        assert callback.run is not None
        out.write_text(json.dumps({"run_id": callback.run.id, "big_norms_sq": module.big_norms_sq}))


if __name__ == "__main__":
    main()
