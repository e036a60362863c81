"""Lightning DDP on 2 CPU processes (gloo) with the noisescope callback; run as a script.

``python _lightning_ddp.py SERVER_URL OUT_JSON``: Lightning's ``ddp`` strategy re-launches this
script for rank 1. Rank 0 writes its run id and the |G_big|^2 its module read before clipping.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch

from noisescope.integrations import LightningCallback
from tests.integrations._lit import DigitsMLP, digits_loader


def main() -> None:
    url, out = sys.argv[1], Path(sys.argv[2])
    torch.set_num_threads(1)
    torch.manual_seed(0)
    module = DigitsMLP()
    callback = LightningCallback(project="integrations", task="digits-ddp", url=url, quiet=True)
    trainer = pl.Trainer(
        max_steps=3,
        accumulate_grad_batches=2,
        gradient_clip_val=0.01,
        accelerator="cpu",
        devices=2,
        strategy="ddp",
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
