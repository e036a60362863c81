"""Tiny models and data for the integration tests: built from configs, nothing downloaded.

Text is the source of a stdlib module read as bytes (one token per byte), cut into sequences of
varying length so batches are padded and the real token counts differ from micro-batch to
micro-batch: the units the callbacks must get right.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from tests.probes.lsq_torch import ListSink

PAD = 256  # byte tokens are 0..255; 256 pads
VOCAB = 257


def byte_sequences(n: int, min_len: int = 6, max_len: int = 20, seed: int = 0) -> list[list[int]]:
    """``n`` token sequences of varying length from a stdlib file's bytes."""
    data = Path(json.__file__).read_bytes()
    gen = torch.Generator().manual_seed(seed)
    out = []
    pos = 0
    for _ in range(n):
        length = int(torch.randint(min_len, max_len + 1, (1,), generator=gen))
        if pos + length > len(data):
            pos = 0
        out.append(list(data[pos : pos + length]))
        pos += length
    return out


class ByteLMDataset(torch.utils.data.Dataset[dict[str, list[int]]]):
    def __init__(self, n: int, seed: int = 0) -> None:
        self.seqs = byte_sequences(n, seed=seed)

    def __len__(self) -> int:
        return len(self.seqs)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        return {"input_ids": self.seqs[i]}


class RecordedBatches(list[dict[str, Any]]):
    """Collates with ``transformers.default_data_collator`` and keeps each batch, in order."""

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        from transformers import default_data_collator

        self.append(default_data_collator(features))
        return self[-1]


class RecordingCollator:
    """Pads a batch (labels -100 on padding) and records each batch's labels in order."""

    def __init__(self) -> None:
        self.labels: list[Tensor] = []

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Tensor]:
        longest = max(len(f["input_ids"]) for f in features)
        ids = torch.full((len(features), longest), PAD, dtype=torch.long)
        mask = torch.zeros((len(features), longest), dtype=torch.long)
        for i, f in enumerate(features):
            seq = torch.tensor(f["input_ids"], dtype=torch.long)
            ids[i, : len(seq)] = seq
            mask[i, : len(seq)] = 1
        labels = ids.masked_fill(mask == 0, -100)
        self.labels.append(labels.clone())
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def tiny_gpt2(seed: int = 0, dropout: float = 0.1) -> nn.Module:
    """A 2-layer GPT-2: its embedding tied to the head, positions (1, T) broadcast over the
    batch, Conv1D layers."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=2, resid_pdrop=dropout,
        embd_pdrop=dropout, attn_pdrop=dropout, bos_token_id=PAD, eos_token_id=PAD,
        pad_token_id=PAD,
    )  # fmt: skip
    return GPT2LMHeadModel(config)


def tiny_llama(seed: int = 0) -> nn.Module:
    """A 2-layer Llama with untied embeddings: every parameter in one module, used once per
    forward, batch first (rotary positions have no parameters), so the per-example source
    measures it exactly."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
        tie_word_embeddings=False, bos_token_id=PAD, eos_token_id=PAD, pad_token_id=PAD,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def unpad(labels: Tensor) -> dict[str, Tensor]:
    """The batch ``RecordingCollator`` made from its recorded labels (padding is PAD, mask 0)."""
    real = labels.ne(-100)
    return {
        "input_ids": labels.masked_fill(~real, PAD),
        "attention_mask": real.long(),
        "labels": labels,
    }


class Recorder(ListSink):
    """A ``Sink`` for a hand-written loop's probe: its whole-model samples, as the server
    stores them."""

    def __init__(self, units: str) -> None:
        super().__init__()
        self.units = units

    @property
    def samples(self) -> list[dict[str, Any]]:
        keys = ("step", "b_small", "b_big", "g_small_sq", "g_big_sq", "loss")
        return [{k: row[k] for k in keys} for row in self.series("")]
