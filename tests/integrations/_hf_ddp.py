"""Hugging Face Trainer under DDP (2 CPU processes, gloo) with the noisescope callback.

Run with ``python -m torch.distributed.run --nproc_per_node 2 _hf_ddp.py SERVER_URL OUT_DIR``.
Each rank writes the label tokens of the micro-batches its collator produced; rank 0 also writes
the run id and the Trainer's logged (pre-clipping) gradient norms.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch
from transformers import Trainer, TrainingArguments

from noisescope.integrations import HuggingFaceCallback
from tests.integrations._tiny import ByteLMDataset, RecordingCollator, tiny_gpt2
from tests.support.trainers import QUIET_HF


def main() -> None:
    url, out = sys.argv[1], Path(sys.argv[2])
    torch.set_num_threads(1)
    collator = RecordingCollator()
    callback = HuggingFaceCallback(project="integrations", task="gpt2-ddp", url=url, quiet=True)
    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(
            output_dir=tmp,
            per_device_train_batch_size=4,
            gradient_accumulation_steps=2,
            max_steps=3,
            learning_rate=1e-3,
            max_grad_norm=0.01,
            logging_steps=1,
            ddp_backend="gloo",
            **QUIET_HF,
        )
        trainer = Trainer(
            model=tiny_gpt2(),
            args=args,
            train_dataset=ByteLMDataset(96),
            data_collator=collator,
            callbacks=[callback],
        )
        trainer.train()
    rank = args.process_index
    result: dict[str, object] = {
        "shifted": [[int(lab[:, 1:].ne(-100).sum()) for lab in collator.labels]],
        "unshifted": [[int(lab.ne(-100).sum()) for lab in collator.labels]],
    }
    if rank == 0:
        assert callback.run is not None
        result["run_id"] = callback.run.id
        result["grad_norms"] = [
            h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h
        ]
    (out / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
