"""Lightning's ModelParallelStrategy (FSDP2, ``fully_shard``) on 2 CPU processes (gloo) with the
noisescope callback; run as a script.

``python _lightning_fsdp2.py SERVER_URL OUT_JSON``: Lightning re-launches this script for rank
1. Rank 0 writes its run id and the |G_big|^2 its module read before clipping (the shards'
squared norms summed over the ranks).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed.fsdp import fully_shard

from tests.integrations._lit import DigitsMLP, fit_on_two_ranks


class ShardedDigits(DigitsMLP):
    def configure_model(self) -> None:
        assert self.device_mesh is not None  # ModelParallelStrategy has set it up
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
    fit_on_two_ranks(
        ShardedDigits,
        task="digits-fsdp2",
        strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
        gradient_clip_val=None,
    )


if __name__ == "__main__":
    main()
