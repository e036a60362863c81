"""Fine-tune a small GPT-2 without gradient accumulation and read its noise scale back.

One process, one backward per optimizer step: the Hugging Face callback measures each
sequence's own gradient (per-example norms: B_small is a sequence's real label tokens, B_big
the batch's), before clipping. Start the server first (``noisescope up``), then::

    pip install 'noisescope[transformers]'
    python examples/gpt2_finetune.py
    python examples/gpt2_finetune.py --steps 200 --batch 16

The model is built from a small ``GPT2Config`` (nothing is downloaded) and the "text" is token
ids made up here: sequences of a few repeating patterns with noise, of varying length, padded
per batch (padding gets label -100, which the loss and noisescope skip). At the end the script
reads the run's current B_simple back from the server with ``noisescope.Api`` and prints it.
"""

from __future__ import annotations

import argparse
import random
import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import noisescope
from noisescope.integrations import HuggingFaceCallback

VOCAB = 128
PAD = 0  # token 0 pads; the text uses 1..VOCAB-1


def synthetic_text(n: int, max_len: int, seed: int) -> list[list[int]]:
    """``n`` token sequences of 8..max_len tokens: a repeating pattern, 10% random tokens."""
    rng = random.Random(seed)
    patterns = [[rng.randrange(1, VOCAB) for _ in range(rng.randint(3, 7))] for _ in range(16)]
    out = []
    for _ in range(n):
        pattern = rng.choice(patterns)
        length = rng.randint(8, max_len)
        seq = [pattern[i % len(pattern)] for i in range(length)]
        out.append([rng.randrange(1, VOCAB) if rng.random() < 0.1 else t for t in seq])
    return out


def collate(features: list[list[int]]) -> dict[str, torch.Tensor]:
    """Right-pad; padded positions get label -100."""
    longest = max(len(f) for f in features)
    ids = torch.full((len(features), longest), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, seq in enumerate(features):
        ids[i, : len(seq)] = torch.tensor(seq)
        mask[i, : len(seq)] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=None, help="server URL (default: $NOISESCOPE_URL)")
    parser.add_argument("--project", default="examples")
    parser.add_argument("--batch", type=int, default=8, help="sequences per optimizer step")
    parser.add_argument("--steps", type=int, default=100, help="B_simple needs 64 or more")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--max-len", type=int, default=32)
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=args.max_len, n_embd=64, n_layer=2, n_head=4,
        bos_token_id=PAD, eos_token_id=PAD, pad_token_id=PAD,
    )  # fmt: skip
    callback = HuggingFaceCallback(project=args.project, task="gpt2-finetune", url=args.url)
    with tempfile.TemporaryDirectory() as out:
        training_args = TrainingArguments(
            output_dir=out,
            run_name=f"gpt2-b{args.batch}",
            per_device_train_batch_size=args.batch,
            gradient_accumulation_steps=1,  # no accumulation: per-example norms
            max_steps=args.steps,
            learning_rate=args.lr,
            max_grad_norm=1.0,  # noisescope measures before this clipping
            logging_steps=50,
            save_strategy="no",
            report_to=[],
            use_cpu=not torch.cuda.is_available(),
            seed=0,
        )
        trainer = Trainer(
            model=GPT2LMHeadModel(config),
            args=training_args,
            train_dataset=synthetic_text(args.batch * args.steps, args.max_len, seed=0),
            data_collator=collate,
            callbacks=[callback],
        )
        trainer.train()  # the callback finishes the run: every sample is on the server

    assert callback.run is not None
    try:
        with noisescope.Api(args.url) as api:
            run = api.run(callback.run.id)
    except noisescope.ApiError as exc:  # no server (offline mode: `noisescope sync` later)
        raise SystemExit(f"could not read run {callback.run.id} back: {exc}") from None
    print(f"noisescope run {run.uid}: {run.n_samples} samples in {run.units}")
    if run.b_simple is None:
        print(f"B_simple: not yet measurable ({run.b_simple_reason})")
        return
    lo, hi = run.b_simple_lo, run.b_simple_hi
    interval = f" (90% interval {lo:,.0f} to {hi:,.0f})" if lo is not None and hi else ""
    print(f"B_simple: {run.b_simple:,.0f} {run.units}{interval}")


if __name__ == "__main__":
    main()
