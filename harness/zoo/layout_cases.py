"""The second zoo (issue 54): layouts the per-example source must cover, each a ``ZooCase``
(``cases``) of N = 32 examples at fixed weights, float32 as a user builds them (``float64``:
float64; ``bf16_autocast``: float32 weights, the forward under CPU bfloat16 autocast).

``LAYOUT_BUILDERS`` names them; ``BATCHNORM`` the ones with no per-example gradient (BatchNorm
in training mode mixes a batch's examples: their truth is each micro-batch's own gradient,
``micro_grads``). ``ROW_RTOL`` is how close a logged row must be to its exact value: 1e-4,
and 5e-3 under bfloat16 (the probe's norms and the truth's gradients are rounded to 8 bits at
different places). ``mutated`` adds a use of one parameter outside its module's forward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .cases import VOCAB, T, ZooCase, _lm_case, _sequences, image_case
from .layouts import (
    BagClassifier,
    BatchNormResNet,
    ConvNeXtNet,
    EncoderClassifier,
    MatmulClassifier,
    NormMLP,
    TiedLM,
    WeightNormConvNet,
)
from .models import GPT, GPTConfig
from .truth import flat_grad, trainable

N = 32
ROW_RTOL = 1e-4
BF16_ROW_RTOL = 5e-3


def _ones() -> Tensor:
    return torch.ones(N, dtype=torch.double)


def _classify(
    name: str, model: nn.Module, gen: torch.Generator, hf: bool = False, length: int = T
) -> ZooCase:
    """Token sequences, three classes by the first token (ids 1-39, 40-55, 56-63)."""
    x = _sequences(gen, N, length)
    y = (x[:, 0] >= 40).long() + (x[:, 0] >= 56).long()

    def losses(call: Callable[..., Any], batch: tuple[Tensor, ...]) -> Tensor:
        ids, labels = batch
        logits = call(input_ids=ids).logits if hf else call(ids)
        return F.cross_entropy(logits, labels, reduction="none")

    return ZooCase(name, model, (x, y), losses, _ones())


# --- hand-written layouts -----------------------------------------------------------------------


def transformer_encoder() -> ZooCase:
    torch.manual_seed(0)
    model = EncoderClassifier(VOCAB, T).train()
    return _classify("transformer_encoder", model, torch.Generator().manual_seed(20))


def tied_lm() -> ZooCase:
    torch.manual_seed(0)
    model = TiedLM(VOCAB, T).train()
    return _lm_case("tied_lm", model, torch.Generator().manual_seed(21), False, N)


def custom_matmul() -> ZooCase:
    torch.manual_seed(0)
    model = MatmulClassifier(VOCAB, T).train()
    return _classify("custom_matmul", model, torch.Generator().manual_seed(33))


def _images(name: str, make: Callable[[], nn.Module], seed: int) -> ZooCase:
    torch.manual_seed(0)
    model = make().train()
    return image_case(name, model, torch.Generator().manual_seed(seed), torch.float32, N)


def convnext() -> ZooCase:
    return _images("convnext", ConvNeXtNet, 22)


def weight_norm_conv() -> ZooCase:
    return _images("weight_norm_conv", WeightNormConvNet, 23)


def batchnorm_resnet() -> ZooCase:
    return _images("batchnorm_resnet", BatchNormResNet, 24)


def embedding_bag() -> ZooCase:
    """Bags of 2 to 8 ids (right-padded with 0 in ``data``); the loop passes them flat, with
    offsets; three classes by the bag's first id."""
    torch.manual_seed(0)
    model = BagClassifier(VOCAB).train()
    gen = torch.Generator().manual_seed(25)
    ids = _sequences(gen, N, T)
    lengths = torch.randint(2, T + 1, (N,), generator=gen)
    y = (ids[:, 0] >= 40).long() + (ids[:, 0] >= 56).long()

    def losses(call: Callable[..., Any], batch: tuple[Tensor, ...]) -> Tensor:
        x, n, labels = batch
        flat = torch.cat([row[:k] for row, k in zip(x, n.tolist(), strict=True)])
        offsets = torch.cumsum(n, 0) - n
        return F.cross_entropy(call(flat, offsets), labels, reduction="none")

    return ZooCase("embedding_bag", model, (ids, lengths, y), losses, _ones())


def float64() -> ZooCase:
    """Gaussian features, three classes by two fixed directions."""
    torch.manual_seed(0)
    model = NormMLP(8).double().train()
    gen = torch.Generator().manual_seed(26)
    x = torch.randn(N, 8, generator=gen, dtype=torch.double)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()

    def losses(call: Callable[..., Any], batch: tuple[Tensor, ...]) -> Tensor:
        features, labels = batch
        return F.cross_entropy(call(features), labels, reduction="none")

    return ZooCase("float64", model, (x, y), losses, _ones())


def bf16_autocast() -> ZooCase:
    """nanoGPT (models.GPT) in float32, its forward under ``torch.autocast("cpu", bfloat16)``;
    the loss in float32."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=T, vocab_size=VOCAB, n_embd=16)).train()
    case = _lm_case("bf16_autocast", model, torch.Generator().manual_seed(27), False, N)
    plain = case.losses

    def losses(call: Callable[..., Any], batch: tuple[Tensor, ...]) -> Tensor:
        def autocast_call(*args: Any, **kwargs: Any) -> Tensor:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out: Tensor = call(*args, **kwargs)
            return out.float()

        return plain(autocast_call, batch)

    case.losses = losses
    return case


# --- Hugging Face, from configs -----------------------------------------------------------------


def _hf_config(cls: Any, **settings: Any) -> Any:
    """A transformers config (typed loosely: version 5 takes some settings as extra kwargs)."""
    return cls(**settings)


def wav2vec2() -> ZooCase:
    """Sequence classification of 80-sample clips: a sine of one of 3 frequencies plus noise.
    Two feature-extractor convs (GroupNorm on the first), a weight-normed positional conv."""
    from transformers import Wav2Vec2Config, Wav2Vec2ForSequenceClassification

    torch.manual_seed(0)
    config = _hf_config(
        Wav2Vec2Config,
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, conv_dim=(8, 8), conv_stride=(4, 2), conv_kernel=(8, 4),
        num_conv_pos_embeddings=4, num_conv_pos_embedding_groups=2, num_labels=3,
        classifier_proj_size=8, feat_proj_dropout=0.0, final_dropout=0.0, layerdrop=0.0,
        apply_spec_augment=False, mask_time_prob=0.0, attention_dropout=0.0, hidden_dropout=0.0,
        activation_dropout=0.0,
    )  # fmt: skip
    model = Wav2Vec2ForSequenceClassification(config).train()
    gen = torch.Generator().manual_seed(28)
    u = torch.rand(N, generator=gen)
    y = (u > 0.6).long() + (u > 0.9).long()  # unequal classes: a mean gradient well above 0
    t = torch.arange(80, dtype=torch.float32)
    noise = 0.3 * torch.randn(N, 80, generator=gen)
    audio = torch.sin(t[None, :] * (0.2 + 0.4 * y[:, None])) + noise

    def losses(call: Callable[..., Any], batch: tuple[Tensor, ...]) -> Tensor:
        x, labels = batch
        return F.cross_entropy(call(input_values=x).logits, labels, reduction="none")

    return ZooCase("wav2vec2", model, (audio, y), losses, _ones())


def whisper() -> ZooCase:
    """Encoder-decoder on 8 mel bins x 16 frames; the decoder learns T tokens."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(0)
    config = _hf_config(
        WhisperConfig,
        vocab_size=VOCAB, num_mel_bins=8, d_model=16, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
        decoder_ffn_dim=32, max_source_positions=8, max_target_positions=2 * T, dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0, decoder_start_token_id=1, pad_token_id=0,
        eos_token_id=2, bos_token_id=1, use_cache=False, apply_spec_augment=False,
        encoder_layerdrop=0.0, decoder_layerdrop=0.0,
    )  # fmt: skip
    model = WhisperForConditionalGeneration(config).train()
    gen = torch.Generator().manual_seed(29)
    labels = _sequences(gen, N, T)
    features = torch.randn(N, 8, 16, generator=gen)
    features[:, 0, :] += labels[:, :1].float() / VOCAB  # the first token is audible

    def losses(call: Callable[..., Any], batch: tuple[Tensor, ...]) -> Tensor:
        x, y = batch
        logits = call(input_features=x, labels=y).logits
        ce = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none")
        return ce.view(y.shape).mean(1)

    return ZooCase("whisper", model, (features, labels), losses, _ones())


def deberta_v2() -> ZooCase:
    """Relative attention with a LayerNorm over the batch-less relative-position table."""
    from transformers import DebertaV2Config, DebertaV2ForSequenceClassification

    torch.manual_seed(0)
    config = _hf_config(
        DebertaV2Config,
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=2 * T, relative_attention=True,
        position_buckets=4, norm_rel_ebd="layer_norm", pos_att_type=["p2c", "c2p"],
        position_biased_input=False, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        pooler_dropout=0.0, pooler_hidden_size=16, type_vocab_size=0, num_labels=3,
    )  # fmt: skip
    model = DebertaV2ForSequenceClassification(config).train()
    return _classify("deberta_v2", model, torch.Generator().manual_seed(30), hf=True)


def gpt_neox() -> ZooCase:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(0)
    config = _hf_config(
        GPTNeoXConfig,
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=2 * T, rotary_pct=0.5, use_cache=False,
        attention_dropout=0.0, hidden_dropout=0.0, bos_token_id=1, eos_token_id=1,
        attn_implementation="eager",
    )  # fmt: skip
    model = GPTNeoXForCausalLM(config).train()
    return _lm_case("gpt_neox", model, torch.Generator().manual_seed(31), True, N)


def mamba() -> ZooCase:
    """The pure-torch path (no CUDA kernels on the CPU)."""
    from transformers import MambaConfig, MambaForCausalLM

    torch.manual_seed(0)
    config = _hf_config(
        MambaConfig,
        vocab_size=VOCAB, hidden_size=16, state_size=4, num_hidden_layers=1, expand=2,
        conv_kernel=4, use_cache=False, use_mambapy=False, bos_token_id=1, eos_token_id=1,
        pad_token_id=0,
    )  # fmt: skip
    model = MambaForCausalLM(config).train()
    return _lm_case("mamba", model, torch.Generator().manual_seed(32), True, N)


LAYOUT_BUILDERS: dict[str, Callable[[], ZooCase]] = {
    "transformer_encoder": transformer_encoder,
    "tied_lm": tied_lm,
    "convnext": convnext,
    "weight_norm_conv": weight_norm_conv,
    "wav2vec2": wav2vec2,
    "whisper": whisper,
    "deberta_v2": deberta_v2,
    "gpt_neox": gpt_neox,
    "mamba": mamba,
    "embedding_bag": embedding_bag,
    "custom_matmul": custom_matmul,
    "float64": float64,
    "batchnorm_resnet": batchnorm_resnet,
    "bf16_autocast": bf16_autocast,
}
BATCHNORM = {"batchnorm_resnet"}


def row_rtol(name: str) -> float:
    return BF16_ROW_RTOL if name == "bf16_autocast" else ROW_RTOL


def micro_grads(case: ZooCase, micro: list[Tensor]) -> list[Tensor]:
    """Each micro-batch's gradient of its mean loss, flattened over the trainable parameters
    (float64): the truth where examples mix (BatchNorm)."""
    params = trainable(case.model)
    return [flat_grad(case.batch_loss(idx), params) for idx in micro]
