"""Train a small GPT-2 with the Hugging Face Trainer and track its gradient noise scale.

Start the server and dashboard first (``noisescope up``), then::

    pip install 'noisescope[transformers]'
    python examples/hf_trainer.py                        # 4 micro-batches of 8 sequences
    python examples/hf_trainer.py --accumulation 8 --name k8
    python -m torch.distributed.run --nproc_per_node 2 examples/hf_trainer.py --ddp-backend gloo

The model is built from a config (nothing is downloaded) and reads Python's own source files as
bytes (one token per byte), cut into sequences of varying length, so batches are padded: the
callback counts the real label tokens, and B_small / B_big are in tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from noisescope.integrations import HuggingFaceCallback

PAD = 256  # bytes are tokens 0..255


def byte_sequences(n: int, max_len: int, seed: int) -> list[list[int]]:
    """``n`` byte sequences of 16..max_len tokens from the standard library's source."""
    text = b"".join(Path(str(m.__file__)).read_bytes() for m in (json, os, random, argparse))
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.randint(16, max_len)
        start = rng.randrange(0, len(text) - length)
        out.append(list(text[start : start + length]))
    return out


def collate(features: list[list[int]]) -> dict[str, torch.Tensor]:
    """Right-pad; padded positions get label -100, which the loss (and noisescope) skip."""
    longest = max(len(f) for f in features)
    ids = torch.full((len(features), longest), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, seq in enumerate(features):
        ids[i, : len(seq)] = torch.tensor(seq)
        mask[i, : len(seq)] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--url", default=None, help="server URL (default: $NOISESCOPE_URL or local)"
    )
    parser.add_argument("--project", default="examples")
    parser.add_argument("--name", default=None)
    parser.add_argument("--micro-batch", type=int, default=8, help="sequences per micro-batch")
    parser.add_argument("--accumulation", type=int, default=4, help="micro-batches per step")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--ddp-backend", default=None, help="e.g. gloo for DDP on CPUs")
    parser.add_argument("--mode", default=None, help="online (default), offline or disabled")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=PAD + 1,
        n_positions=args.max_len,
        n_embd=args.width,
        n_layer=args.layers,
        n_head=4,
        bos_token_id=PAD,
        eos_token_id=PAD,
        pad_token_id=PAD,
    )
    model = GPT2LMHeadModel(config)
    train = byte_sequences(args.micro_batch * args.accumulation * args.steps, args.max_len, 0)
    # url and mode None: $NOISESCOPE_URL / $NOISESCOPE_MODE or the defaults
    callback = HuggingFaceCallback(
        project=args.project, task="bytes-gpt2", url=args.url, mode=args.mode
    )
    with tempfile.TemporaryDirectory() as out:
        training_args = TrainingArguments(
            output_dir=out,
            run_name=args.name or f"mb{args.micro_batch}-k{args.accumulation}",
            per_device_train_batch_size=args.micro_batch,
            gradient_accumulation_steps=args.accumulation,
            max_steps=args.steps,
            learning_rate=args.lr,
            max_grad_norm=1.0,  # noisescope measures before this clipping
            logging_steps=20,
            save_strategy="no",
            report_to=[],
            use_cpu=not torch.cuda.is_available(),
            ddp_backend=args.ddp_backend,
            seed=0,
        )
        trainer = Trainer(
            model=model,
            args=training_args,
            train_dataset=train,
            data_collator=collate,
            callbacks=[callback],
        )
        trainer.train()
    if callback.run is not None and training_args.process_index == 0:
        print(f"noisescope run {callback.run.id}: {callback.run.status().line()}")


if __name__ == "__main__":
    main()
