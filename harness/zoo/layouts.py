"""Hand-written models of the second zoo (issue 54): layouts a researcher writes that the first
zoo (``models``) does not hold. Tiny, dropout 0, deterministic; float32 unless a case says.

- ``EncoderClassifier``: ``nn.TransformerEncoder`` of ``nn.TransformerEncoderLayer(
  batch_first=True)`` (the PyTorch tutorial model): ``nn.MultiheadAttention`` hands its
  ``out_proj`` parameters to ``F.multi_head_attention_forward``, not to ``out_proj``'s forward;
- ``TiedLM``: the head is ``F.linear(h, self.tok_emb.weight)`` (tying written functionally);
- ``ConvNeXtNet``: ConvNeXt's own ``LayerNorm`` class, channels-first
  (``weight[:, None, None] * x + bias[:, None, None]``), and its layer scale ``gamma * x``;
- ``WeightNormConvNet``: convolutions under ``torch.nn.utils.parametrizations.weight_norm``;
- ``BagClassifier``: ``nn.EmbeddingBag`` fed flat ids with ``offsets`` (one example per bag);
- ``MatmulClassifier``: a module computing with its own parameters by ``x @ self.w`` and
  ``torch.einsum`` (no nn.Linear);
- ``NormMLP``: Linear, LayerNorm, GELU, Linear (the float64 case);
- ``BatchNormResNet``: a basic residual block with BatchNorm in training mode.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.parametrizations import weight_norm


class EncoderClassifier(nn.Module):
    def __init__(self, vocab: int, t: int, d: int = 16, n_classes: int = 3) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(0.1 * torch.randn(t, d))  # read directly, broadcast over batch
        layer = nn.TransformerEncoderLayer(
            d, nhead=2, dim_feedforward=2 * d, dropout=0.0, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, num_layers=1, enable_nested_tensor=False)
        self.head = nn.Linear(d, n_classes)

    def forward(self, idx: Tensor) -> Tensor:
        h = self.encoder(self.emb(idx) + self.pos[: idx.shape[1]])
        out: Tensor = self.head(h.mean(1))
        return out


class TiedLM(nn.Module):
    """Token and position embeddings, one pre-norm MLP block, the head tied functionally."""

    def __init__(self, vocab: int, t: int, d: int = 16) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d)
        self.pos_emb = nn.Embedding(t, d)
        self.ln = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 2 * d)
        self.proj = nn.Linear(2 * d, d)
        self.ln_f = nn.LayerNorm(d)

    def forward(self, idx: Tensor) -> Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        h = self.tok_emb(idx) + self.pos_emb(pos)
        h = h + self.proj(F.gelu(self.fc(self.ln(h))))
        return F.linear(self.ln_f(h), self.tok_emb.weight)


class ChannelsLayerNorm(nn.Module):
    """ConvNeXt's ``LayerNorm`` (facebookresearch/ConvNeXt, models/convnext.py), as written
    there: ``channels_last`` goes to ``F.layer_norm``, ``channels_first`` normalizes dim 1."""

    def __init__(self, d: int, eps: float = 1e-6, data_format: str = "channels_last") -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))
        self.eps = eps
        self.data_format = data_format
        self.normalized_shape = (d,)

    def forward(self, x: Tensor) -> Tensor:
        if self.data_format == "channels_last":
            return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(2).mean(1, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.eps)
        out: Tensor = self.weight[:, None, None] * x + self.bias[:, None, None]
        return out


class ConvNeXtBlock(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(d, d, kernel_size=3, padding=1, groups=d)
        self.norm = ChannelsLayerNorm(d)
        self.pwconv1 = nn.Linear(d, 2 * d)
        self.pwconv2 = nn.Linear(2 * d, d)
        self.gamma = nn.Parameter(0.5 * torch.ones(d))  # layer scale (1e-6 in ConvNeXt)

    def forward(self, x: Tensor) -> Tensor:
        h = self.dwconv(x).permute(0, 2, 3, 1)  # (N, C, H, W) -> (N, H, W, C)
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(h))))
        out: Tensor = x + (self.gamma * h).permute(0, 3, 1, 2)
        return out


class ConvNeXtNet(nn.Module):
    """Patchify stem, channels-first norm, one block, pooled channels-last norm, head."""

    def __init__(self, d: int = 8, n_classes: int = 4) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, d, kernel_size=2, stride=2)
        self.stem_norm = ChannelsLayerNorm(d, data_format="channels_first")
        self.block = ConvNeXtBlock(d)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, n_classes)

    def forward(self, x: Tensor) -> Tensor:
        h = self.block(self.stem_norm(self.stem(x)))
        out: Tensor = self.head(self.norm(h.mean((2, 3))))
        return out


class WeightNormConvNet(nn.Module):
    def __init__(self, n_classes: int = 4) -> None:
        super().__init__()
        self.conv1 = weight_norm(nn.Conv2d(1, 4, 3, padding=1))
        self.conv2 = weight_norm(nn.Conv2d(4, 4, 3, stride=2, padding=1))
        self.head = nn.Linear(4 * 4 * 4, n_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.conv2(F.relu(self.conv1(x))))
        out: Tensor = self.head(x.flatten(1))
        return out


class BagClassifier(nn.Module):
    """``forward(ids, offsets)``: ``ids`` the bags' tokens back to back, ``offsets`` where each
    bag starts (``nn.EmbeddingBag``'s 1-D input)."""

    def __init__(self, vocab: int, d: int = 16, n_classes: int = 3) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(vocab, d, mode="mean")
        self.head = nn.Linear(d, n_classes)

    def forward(self, ids: Tensor, offsets: Tensor) -> Tensor:
        out: Tensor = self.head(torch.tanh(self.bag(ids, offsets)))
        return out


class MatmulMixer(nn.Module):
    """Token mixing by ``einsum`` with a (T, T) parameter, channel mixing by ``x @ self.w``."""

    def __init__(self, t: int, d: int) -> None:
        super().__init__()
        self.mix = nn.Parameter(torch.eye(t) + 0.1 * torch.randn(t, t))
        self.w = nn.Parameter(torch.randn(d, d) / d**0.5)
        self.b = nn.Parameter(torch.zeros(d))

    def forward(self, x: Tensor) -> Tensor:
        h = torch.einsum("st,btd->bsd", self.mix, x)
        return x + torch.tanh(h @ self.w + self.b)


class MatmulClassifier(nn.Module):
    def __init__(self, vocab: int, t: int, d: int = 16, n_classes: int = 3) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.mixer = MatmulMixer(t, d)
        self.head = nn.Linear(d, n_classes)

    def forward(self, idx: Tensor) -> Tensor:
        out: Tensor = self.head(self.mixer(self.emb(idx)).mean(1))
        return out


class NormMLP(nn.Module):
    def __init__(self, d_in: int, d: int = 16, n_classes: int = 3) -> None:
        super().__init__()
        self.fc = nn.Linear(d_in, d)
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, n_classes)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.head(F.gelu(self.ln(self.fc(x))))
        return out


class BatchNormResNet(nn.Module):
    """Stem conv + BatchNorm, one basic block (conv-BN-ReLU-conv-BN, identity shortcut), head."""

    def __init__(self, d: int = 4, n_classes: int = 4) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, d, 3, padding=1, bias=False)
        self.bn0 = nn.BatchNorm2d(d)
        self.conv1 = nn.Conv2d(d, d, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(d)
        self.conv2 = nn.Conv2d(d, d, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(d)
        self.head = nn.Linear(d, n_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.bn0(self.stem(x)))
        x = F.relu(x + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))
        out: Tensor = self.head(x.mean((2, 3)))
        return out
