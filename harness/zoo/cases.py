"""The zoo: tiny versions of the models people train, each with a finite data set of N examples.

A ``ZooCase`` holds a model (float64, dropout 0, train mode), its data (tensors with N rows) and
``losses(call, batch)``: each example's loss *summed over its items*:

- ``units == "examples"``: the example's own loss (a language model's: the mean over its T
  tokens, so that the batch loss, the mean over examples, is the usual mean over all B*T tokens);
  every example counts 1 item.
- ``units == "tokens"`` (the padded case): the sum of the cross-entropies of the example's real
  tokens (label != -100); the example counts its real tokens.

The training loop's loss of a batch is ``losses.sum() / counts.sum()``: the mean over the batch's
items (examples, or real tokens), as ``F.cross_entropy(..., reduction="mean")`` and the Hugging
Face models' own losses reduce it. ``call`` is the model or a functional stand-in for it
(``torch.func.functional_call``), so that the same loss serves brute force and torch.func.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .models import GPT, GPTConfig, GroupNormConvNet, LSTMClassifier, MoELM, add_lora

VOCAB = 64
T = 8
N = 64

Losses = Callable[[Callable[..., Any], tuple[Tensor, ...]], Tensor]


@dataclass
class ZooCase:
    name: str
    model: nn.Module
    data: tuple[Tensor, ...]  # each with N rows
    losses: Losses  # (call, batch) -> (b,) each example's summed loss (module docstring)
    counts: Tensor  # (N,) float64: each example's items (1, or its real tokens)
    units: Literal["examples", "tokens"] = "examples"

    @property
    def n(self) -> int:
        return int(self.counts.shape[0])

    def batch(self, idx: Tensor) -> tuple[Tensor, ...]:
        return tuple(d[idx] for d in self.data)

    def example_losses(self, idx: Tensor) -> Tensor:
        return self.losses(self.model, self.batch(idx))

    def batch_loss(self, idx: Tensor, divisor: float | None = None) -> Tensor:
        """The loop's loss: the sum over the batch's items divided by their count (the mean), or
        by ``divisor`` (Hugging Face's ``num_items_in_batch``: a step's total)."""
        total = self.counts[idx].sum().item() if divisor is None else divisor
        return self.example_losses(idx).sum() / total

    def items(self, idx: Tensor) -> float:
        return float(self.counts[idx].sum())

    def item_counts(self, idx: Tensor) -> Tensor | None:
        """What ``probe.micro_step(item_counts=...)`` takes: real tokens per example."""
        return self.counts[idx] if self.units == "tokens" else None


# --- data ---------------------------------------------------------------------------------------


def _sequences(gen: torch.Generator, n: int = N, length: int = T + 1) -> Tensor:
    """Token sequences with structure (so the gradient has a signal): mostly
    x_{t+1} = 5 x_t + 3 (mod V - 1) + 1, a random token one time in five; ids 1..V-1 (0: pad)."""
    x = torch.empty(n, length, dtype=torch.long)
    x[:, 0] = torch.randint(1, VOCAB, (n,), generator=gen)
    for t in range(1, length):
        rule = (5 * x[:, t - 1] + 3) % (VOCAB - 1) + 1
        noise = torch.randint(1, VOCAB, (n,), generator=gen)
        x[:, t] = torch.where(torch.rand(n, generator=gen) < 0.8, rule, noise)
    return x


def _lm_example_losses(logits: Tensor, targets: Tensor) -> Tensor:
    """(b, T, V), (b, T) -> each example's mean cross-entropy over its T tokens."""
    ce = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
    return ce.view(targets.shape).mean(1)


def _lm_case(name: str, model: nn.Module, gen: torch.Generator, hf: bool, n: int = N) -> ZooCase:
    seq = _sequences(gen, n)

    def losses(call: Callable[..., Any], batch: tuple[Tensor, ...]) -> Tensor:
        x, y = batch
        out = call(input_ids=x) if hf else call(x)
        return _lm_example_losses(out.logits if hf else out, y)

    return ZooCase(
        name, model, (seq[:, :-1], seq[:, 1:]), losses, torch.ones(n, dtype=torch.double)
    )


def _ready(model: nn.Module) -> nn.Module:
    return model.double().train()


# --- the models ---------------------------------------------------------------------------------


def nanogpt(checkpointing: bool = False) -> ZooCase:
    torch.manual_seed(0)
    model = _ready(GPT(GPTConfig(block_size=T, vocab_size=VOCAB), checkpointing=checkpointing))
    name = "nanogpt_checkpoint" if checkpointing else "nanogpt"
    return _lm_case(name, model, torch.Generator().manual_seed(1), hf=False)


def nanogpt_checkpoint() -> ZooCase:
    return nanogpt(checkpointing=True)


def _gpt2_model() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    settings: dict[str, Any] = {
        "vocab_size": VOCAB,
        "n_positions": T,
        "n_embd": 32,
        "n_layer": 2,
        "n_head": 2,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "use_cache": False,
        "bos_token_id": 1,
        "eos_token_id": 1,
        "attn_implementation": "eager",
    }
    config = GPT2Config(**settings)
    return _ready(GPT2LMHeadModel(config))


def gpt2() -> ZooCase:
    return _lm_case("gpt2", _gpt2_model(), torch.Generator().manual_seed(2), hf=True)


def _llama_model() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    settings: dict[str, Any] = {
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 2 * T,
        "tie_word_embeddings": False,
        "use_cache": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 1,
        "pad_token_id": 0,
        "attn_implementation": "eager",
    }
    config = LlamaConfig(**settings)
    return _ready(LlamaForCausalLM(config))


def llama() -> ZooCase:
    return _lm_case("llama", _llama_model(), torch.Generator().manual_seed(3), hf=True)


def llama_checkpoint() -> ZooCase:
    """Hugging Face's own activation checkpointing (non-reentrant), on in train mode."""
    model = _llama_model()
    hf: Any = model
    kwargs = {"use_reentrant": False}
    if hasattr(hf, "activation_checkpointing_enable"):  # transformers >= 5
        hf.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return _lm_case("llama_checkpoint", model, torch.Generator().manual_seed(3), hf=True)


def bert() -> ZooCase:
    """Sequence classification; no token_type_ids passed: BERT expands its (1, T) buffer."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    settings: dict[str, Any] = {
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "max_position_embeddings": 2 * T,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "num_labels": 3,
        "pad_token_id": 0,
        "attn_implementation": "eager",
    }
    config = BertConfig(**settings)
    model = _ready(BertForSequenceClassification(config))
    x = _sequences(torch.Generator().manual_seed(4), length=T)
    y = (x[:, 0] >= 40).long() + (x[:, 0] >= 56).long()  # classes of 36, 16 and 8 ids

    def losses(call: Callable[..., Any], batch: tuple[Tensor, ...]) -> Tensor:
        ids, labels = batch
        return F.cross_entropy(call(input_ids=ids).logits, labels, reduction="none")

    return ZooCase("bert", model, (x, y), losses, torch.ones(N, dtype=torch.double))


def t5() -> ZooCase:
    """Encoder-decoder: the target is the input reversed; ``shared`` embeds both sides and is
    tied to ``lm_head``; relative attention bias in the first layer of each stack."""
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    settings: dict[str, Any] = {
        "vocab_size": VOCAB,
        "d_model": 32,
        "d_kv": 16,
        "d_ff": 64,
        "num_layers": 2,
        "num_decoder_layers": 2,
        "num_heads": 2,
        "relative_attention_num_buckets": 8,
        "dropout_rate": 0.0,
        "decoder_start_token_id": 0,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "use_cache": False,
    }
    config = T5Config(**settings)
    model = _ready(T5ForConditionalGeneration(config))
    x = _sequences(torch.Generator().manual_seed(5), length=T)
    y = x.flip(1)

    def losses(call: Callable[..., Any], batch: tuple[Tensor, ...]) -> Tensor:
        ids, labels = batch
        return _lm_example_losses(call(input_ids=ids, labels=labels).logits, labels)

    return ZooCase("t5", model, (x, y), losses, torch.ones(N, dtype=torch.double))


def lstm() -> ZooCase:
    torch.manual_seed(0)
    model = _ready(LSTMClassifier(VOCAB))
    x = _sequences(torch.Generator().manual_seed(6), length=T)
    y = (x[:, -1] >= 40).long() + (x[:, -1] >= 56).long()

    def losses(call: Callable[..., Any], batch: tuple[Tensor, ...]) -> Tensor:
        ids, labels = batch
        return F.cross_entropy(call(ids), labels, reduction="none")

    return ZooCase("lstm", model, (x, y), losses, torch.ones(N, dtype=torch.double))


def groupnorm_conv() -> ZooCase:
    torch.manual_seed(0)
    model = _ready(GroupNormConvNet())
    return image_case("groupnorm_conv", model, torch.Generator().manual_seed(7), torch.double)


def image_case(
    name: str, model: nn.Module, gen: torch.Generator, dtype: torch.dtype, n: int = N
) -> ZooCase:
    """Classify 8x8 one-channel images: noise plus a bright quadrant, the label."""
    y = torch.randint(0, 4, (n,), generator=gen)
    x = torch.randn(n, 1, 8, 8, generator=gen, dtype=dtype)
    for i in range(n):
        r, c = divmod(int(y[i]), 2)
        x[i, 0, 4 * r : 4 * r + 4, 4 * c : 4 * c + 4] += 1.0

    def losses(call: Callable[..., Any], batch: tuple[Tensor, ...]) -> Tensor:
        images, labels = batch
        return F.cross_entropy(call(images), labels, reduction="none")

    return ZooCase(name, model, (x, y), losses, torch.ones(n, dtype=torch.double))


def lora() -> ZooCase:
    """nanoGPT with every weight frozen and low-rank adapters on c_attn and c_fc: only the
    adapters train (the tied embedding is frozen)."""
    torch.manual_seed(0)
    model = _ready(add_lora(GPT(GPTConfig(block_size=T, vocab_size=VOCAB))))
    return _lm_case("lora", model, torch.Generator().manual_seed(8), hf=False)


def moe() -> ZooCase:
    torch.manual_seed(0)
    model = _ready(MoELM(VOCAB, 32, T))
    return _lm_case("moe", model, torch.Generator().manual_seed(9), hf=False)


def gpt2_padded() -> ZooCase:
    """Units: tokens. GPT-2 on right-padded sequences of 3 to 8 real tokens (pad id 0, attention
    mask 0, label -100 there); each example's loss is the sum of its real tokens' cross-entropies
    and counts its real tokens. Right padding: no real token attends to a pad (causal), so an
    example's gradient does not depend on its batch."""
    model = _gpt2_model()
    gen = torch.Generator().manual_seed(10)
    seq = _sequences(gen)
    lengths = torch.randint(3, T + 1, (N,), generator=gen)
    real = torch.arange(T)[None, :] < lengths[:, None]
    ids = torch.where(real, seq[:, :-1], 0)
    labels = torch.where(real, seq[:, 1:], -100)
    mask = real.long()

    def losses(call: Callable[..., Any], batch: tuple[Tensor, ...]) -> Tensor:
        x, m, y = batch
        logits = call(input_ids=x, attention_mask=m).logits
        ce = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100, reduction="none")
        return ce.view(y.shape).sum(1)

    return ZooCase(
        "gpt2_padded", model, (ids, mask, labels), losses, lengths.double(), units="tokens"
    )


BUILDERS: dict[str, Callable[[], ZooCase]] = {
    "nanogpt": nanogpt,
    "nanogpt_checkpoint": nanogpt_checkpoint,
    "gpt2": gpt2,
    "bert": bert,
    "llama": llama,
    "llama_checkpoint": llama_checkpoint,
    "t5": t5,
    "lstm": lstm,
    "groupnorm_conv": groupnorm_conv,
    "lora": lora,
    "moe": moe,
    "gpt2_padded": gpt2_padded,
}
