"""Hugging Face Trainer on 2 CPU processes (gloo) with the noisescope callback: under DDP and
under Accelerate's FSDP2 plugin (``fsdp=True``, ``fsdp_config={"version": 2}``).

Run with ``python -m torch.distributed.run --nproc_per_node 2 _hf_two_ranks.py SERVER_URL OUT_DIR``.

Accelerate (1.15) turns its FSDP plugin on only for accelerator devices: on CPU processes it
drops the plugin and the Trainer wraps the model in DDP instead. Here that one gate is lifted
(``_fsdp_on_cpu``: the state Accelerate builds is set to FSDP, as it is on GPUs); the rest is
Accelerate's own FSDP2 path, run for real: ``fully_shard`` of each GPT-2 block and of the root
(``fsdp2_prepare_model``), its ``no_sync`` (``set_requires_gradient_sync(False)``) on the
non-final micro-batches, the reduce-scatter into sharded ``.grad`` and the Trainer's clipping
of the DTensor gradients. Each run, with 1 and 2 micro-batches per step, trains the same model
on the same data once under FSDP2 and once under DDP. Rank 0 writes, per run, the run id, the
Trainer's logged (pre-clipping) gradient norms and the class of the wrapped model; each rank
the label tokens of its micro-batches.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import accelerate.state  # type: ignore[import-untyped]
import torch
from transformers import Trainer, TrainingArguments

from harness import QUIET_HF
from noisescope.integrations import HuggingFaceCallback
from tests.integrations._tiny import ByteLMDataset, RecordingCollator, tiny_gpt2

#: (wrapper, micro-batches per step)
RUNS = [("fsdp2", 1), ("fsdp2", 2), ("ddp", 1), ("ddp", 2)]


@contextmanager
def _fsdp_on_cpu() -> Iterator[None]:
    """Accelerate's FSDP plugin on CPU processes, as it is taken on accelerators."""
    state = accelerate.state
    original = state.AcceleratorState.__init__

    def init(self: Any, *args: Any, fsdp_plugin: Any = None, **kwargs: Any) -> None:
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == state.DistributedType.MULTI_CPU:
            self.distributed_type = state.DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin

    state.AcceleratorState.__init__ = init
    try:
        yield
    finally:
        state.AcceleratorState.__init__ = original


def _train(url: str, wrapper: str, k: int) -> dict[str, Any]:
    accelerate.state.AcceleratorState._reset_state()  # each Trainer builds its own
    os.environ.pop("ACCELERATE_USE_FSDP", None)  # an FSDP Accelerator sets it for the next
    collator = RecordingCollator()
    callback = HuggingFaceCallback(
        project="integrations", task=f"gpt2-{wrapper}-k{k}", url=url, quiet=True
    )
    sharding: dict[str, Any] = {"fsdp": True, "fsdp_config": {"version": 2}}
    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(
            output_dir=tmp,
            per_device_train_batch_size=4,
            gradient_accumulation_steps=k,
            max_steps=3,
            learning_rate=1e-3,
            max_grad_norm=0.01,
            logging_steps=1,
            ddp_backend="gloo",
            **(sharding if wrapper == "fsdp2" else {}),
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
    assert callback.run is not None
    return {
        "run_id": callback.run.id,
        "wrapped": type(trainer.model_wrapped).__name__,
        "grad_norms": [h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h],
        "shifted": [int(lab[:, 1:].ne(-100).sum()) for lab in collator.labels],
        "unshifted": [int(lab.ne(-100).sum()) for lab in collator.labels],
    }


def main() -> None:
    url, out = sys.argv[1], Path(sys.argv[2])
    torch.set_num_threads(1)
    results: dict[str, Any] = {}
    with _fsdp_on_cpu():
        for wrapper, k in RUNS:
            results[f"{wrapper}_k{k}"] = _train(url, wrapper, k)
    rank = torch.distributed.get_rank()
    (out / f"rank{rank}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
