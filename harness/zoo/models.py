"""The zoo's hand-written models: nanoGPT as nanoGPT writes it, LoRA, a routed MLP, an LSTM and a
GroupNorm conv net. Tiny, dropout 0, deterministic. (The Hugging Face models are built from their
configs in ``cases``.)"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

# --- nanoGPT (Karpathy, model.py), as written there, trimmed to the training forward ----------


class LayerNorm(nn.Module):
    """nanoGPT's LayerNorm with an optional bias (PyTorch's had none to switch off)."""

    def __init__(self, ndim: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input: Tensor) -> Tensor:
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


@dataclass
class GPTConfig:
    block_size: int = 8
    vocab_size: int = 64
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    dropout: float = 0.0
    bias: bool = True


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.size()  # nanoGPT's names
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0, is_causal=True
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        out: Tensor = self.resid_dropout(self.c_proj(y))
        return out


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.dropout(self.c_proj(self.gelu(self.c_fc(x))))
        return out


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class _Transformer(nn.Module):
    """nanoGPT's ``nn.ModuleDict(dict(wte=..., ...))``, as a module with typed attributes (the
    same parameter names: ``transformer.wte.weight``, ...)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.ln_f = LayerNorm(config.n_embd, bias=config.bias)


class GPT(nn.Module):
    """nanoGPT's GPT: broadcast ``wpe(arange(t))``, tied ``wte``/``lm_head``. ``checkpointing``:
    each block under ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``."""

    def __init__(self, config: GPTConfig, checkpointing: bool = False) -> None:
        super().__init__()
        self.config = config
        self.checkpointing = checkpointing
        self.transformer = _Transformer(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying, as nanoGPT does
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: Tensor) -> Tensor:
        device = idx.device
        _b, t = idx.size()
        assert t <= self.config.block_size
        pos = torch.arange(0, t, dtype=torch.long, device=device)  # shape (t)
        tok_emb = self.transformer.wte(idx)  # (b, t, n_embd)
        pos_emb = self.transformer.wpe(pos)  # (t, n_embd), broadcast over the batch
        x = self.transformer.drop(tok_emb + pos_emb)
        for block in self.transformer.h:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointing else block(x)
        x = self.transformer.ln_f(x)
        logits: Tensor = self.lm_head(x)
        return logits


# --- low-rank adapters on a frozen base ---------------------------------------------------------


class LoRALinear(nn.Module):
    """y = base(x) + (alpha / r) B(A(x)): ``base`` frozen, A and B trainable (no peft)."""

    def __init__(self, base: nn.Linear, rank: int = 4, alpha: float = 8.0) -> None:
        super().__init__()
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)
        self.lora_a = nn.Linear(base.in_features, rank, bias=False)
        self.lora_b = nn.Linear(rank, base.out_features, bias=False)
        # B is 0 at the start of fine-tuning (no gradient for A then); as if some steps were taken
        nn.init.normal_(self.lora_b.weight, std=0.05)
        self.scale = alpha / rank

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.base(x) + self.scale * self.lora_b(self.lora_a(x))
        return out


def add_lora(model: nn.Module, names: tuple[str, ...] = ("c_attn", "c_fc")) -> nn.Module:
    """Freeze every parameter of ``model``; wrap each Linear whose name ends with one of ``names``
    in a ``LoRALinear`` (the adapters are the only trainable parameters)."""
    for p in model.parameters():
        p.requires_grad_(False)
    targets = [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and name.split(".")[-1] in names
    ]
    for name, m in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, attr, LoRALinear(m))
    return model


# --- a two-expert top-1 routed MLP (Switch-style) -----------------------------------------------


class Top1MoE(nn.Module):
    """Router Linear, argmax routing; each expert runs on its own tokens only (``x[mask]``), its
    output scaled by the router's probability of that expert (so the router gets a gradient)."""

    def __init__(self, d: int, hidden: int, n_experts: int = 2) -> None:
        super().__init__()
        self.router = nn.Linear(d, n_experts)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, d))
            for _ in range(n_experts)
        )

    def forward(self, x: Tensor) -> Tensor:
        probs = self.router(x).softmax(-1)  # (B, T, E)
        choice = probs.argmax(-1)  # (B, T)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            mask = choice == e
            out[mask] = expert(x[mask]) * probs[..., e][mask].unsqueeze(-1)
        return out


class MoELM(nn.Module):
    """Token + position embeddings (batch-first), one routed MLP block, LayerNorm, untied head."""

    def __init__(self, vocab: int = 64, d: int = 32, t: int = 8) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(t, d)
        self.ln_1 = nn.LayerNorm(d)
        self.moe = Top1MoE(d, 2 * d)
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx: Tensor) -> Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device).expand_as(idx)
        x = self.wte(idx) + self.wpe(pos)
        x = x + self.moe(self.ln_1(x))
        out: Tensor = self.head(self.ln_f(x))
        return out


# --- recurrent and convolutional classifiers ----------------------------------------------------


class LSTMClassifier(nn.Module):
    def __init__(self, vocab: int = 64, d: int = 16, hidden: int = 24, n_classes: int = 3) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.lstm = nn.LSTM(d, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, n_classes)

    def forward(self, idx: Tensor) -> Tensor:
        out, _ = self.lstm(self.emb(idx))
        logits: Tensor = self.head(out[:, -1])
        return logits


class GroupNormConvNet(nn.Module):
    def __init__(self, n_classes: int = 4) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.gn1 = nn.GroupNorm(2, 8)
        self.conv2 = nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.gn2 = nn.GroupNorm(2, 8)
        self.head = nn.Linear(8 * 4 * 4, n_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.gn1(self.conv1(x)))
        x = F.relu(self.gn2(self.conv2(x)))
        out: Tensor = self.head(x.flatten(1))
        return out
