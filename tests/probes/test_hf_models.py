"""Per-example norms on Hugging Face models the zoo does not hold, against brute force.

Each is built from a tiny config (nothing downloaded) and brings a layout of its own: OPT feeds
its norms and MLP the flattened tokens (``h.reshape(-1, d)``) and computes positions from the
mask inside an ``nn.Embedding`` subclass; Mixtral's experts are 3-D parameters in one module fed
the routed tokens; Gemma scales its norms by ``(1 + weight)``; ViT keeps its cls token and
position table as parameters of a container; BART's embeddings are ``nn.Embedding``
subclasses. Every parameter's per-example squared norms must match one backward per example.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from noisescope.torch import PerExampleNorms

transformers = pytest.importorskip("transformers")

B, T, V = 3, 7, 40
SMALL = {
    "vocab_size": V,
    "hidden_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 32,
    "max_position_embeddings": 32,
}


def _opt() -> nn.Module:
    config = transformers.OPTConfig(
        vocab_size=V, hidden_size=16, num_hidden_layers=2, ffn_dim=32, num_attention_heads=2,
        max_position_embeddings=32, word_embed_proj_dim=16, dropout=0.0, attention_dropout=0.0,
    )  # fmt: skip
    model: nn.Module = transformers.OPTForCausalLM(config)
    return model


def _mixtral() -> nn.Module:
    config = transformers.MixtralConfig(
        **SMALL, num_key_value_heads=1, num_local_experts=2, num_experts_per_tok=1
    )
    model: nn.Module = transformers.MixtralForCausalLM(config)
    return model


def _gemma() -> nn.Module:
    config = transformers.GemmaConfig(**SMALL, num_key_value_heads=1, head_dim=8)
    model: nn.Module = transformers.GemmaForCausalLM(config)
    return model


def _bart() -> nn.Module:
    config = transformers.BartConfig(
        vocab_size=V, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
        max_position_embeddings=32, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
    )  # fmt: skip
    model: nn.Module = transformers.BartForConditionalGeneration(config)
    return model


def _vit() -> nn.Module:
    config = transformers.ViTConfig(
        image_size=8, patch_size=4, num_channels=3, hidden_size=16, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=32, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, num_labels=2,
    )  # fmt: skip
    model: nn.Module = transformers.ViTForImageClassification(config)
    return model


def _lm_loss(ids: Tensor, mask: Tensor) -> Callable[[nn.Module], Tensor]:
    def per_example(model: nn.Module) -> Tensor:
        logits = model(input_ids=ids, attention_mask=mask, labels=ids).logits
        per_token = F.cross_entropy(
            logits.reshape(-1, V).double(), ids.reshape(-1), reduction="none"
        )
        return per_token.reshape(B, T).mean(1)

    return per_example


def _image_loss(pixels: Tensor, labels: Tensor) -> Callable[[nn.Module], Tensor]:
    def per_example(model: nn.Module) -> Tensor:
        return F.cross_entropy(model(pixel_values=pixels).logits, labels, reduction="none")

    return per_example


def _brute_force(model: nn.Module, losses_of: Callable[[nn.Module], Tensor]) -> list[Tensor]:
    ref = copy.deepcopy(model)
    params = [p for p in ref.parameters() if p.requires_grad]
    losses = losses_of(ref)
    out = [torch.zeros(B, dtype=torch.float64) for _ in params]
    for i in range(B):
        grads = torch.autograd.grad(losses[i] / B, params, retain_graph=True, allow_unused=True)
        for row, g in zip(out, grads, strict=True):
            row[i] = 0.0 if g is None else g.double().square().sum()
    return out


@pytest.mark.parametrize(
    ("make", "dtype"),
    [
        (_opt, torch.float64),
        (_mixtral, torch.float32),  # grouped matrix products take no float64
        (_gemma, torch.float64),
        (_bart, torch.float64),
        (_vit, torch.float64),
    ],
    ids=["opt", "mixtral", "gemma", "bart", "vit"],
)
def test_per_example_norms_match_brute_force(
    make: Callable[[], nn.Module], dtype: torch.dtype
) -> None:
    torch.manual_seed(0)
    model = make().to(dtype).train()
    if make is _vit:
        losses_of = _image_loss(torch.randn(B, 3, 8, 8, dtype=dtype), torch.randint(0, 2, (B,)))
    else:
        mask = torch.ones(B, T, dtype=torch.long)
        losses_of = _lm_loss(torch.randint(3, V, (B, T)), mask)
    params = [p for p in model.parameters() if p.requires_grad]
    expected = _brute_force(model, losses_of)  # before the hooks: a deep copy would take them
    norms = PerExampleNorms(model, {id(p): i for i, p in enumerate(params)})
    norms.armed = True
    for step in range(2):  # a layout moved to torch.func at the first step is exact at the next
        losses_of(model).mean().backward()
        model.zero_grad(set_to_none=True)
        got = norms.take(torch.device("cpu"))
        scale = float(sum(e.max() for e in expected))
        worst = max(float((g.double() - e).abs().max()) for g, e in zip(got, expected, strict=True))
        assert worst <= 1e-6 * scale, (step, worst)  # the probe sums in float32
