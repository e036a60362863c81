"""Issue 54's rules, on models written for these tests (the zoo has its own): every parameter's
per-example squared norms against brute force (one autograd.grad per example), from the first
step, or the step left unmeasured with the reason; never a missing use counted as zero.

- uses outside a parameter's module: ``F.linear(h, emb.weight)``, ``h @ emb.weight.T``,
  ``child.weight @ x`` (the Linear identity, with the cross terms against the embedding),
  ``F.conv1d`` with a child's weight (torch.func over the parent), an elementwise read of a
  norm's gain and a bias (followed to the batch), ``nn.MultiheadAttention``'s ``out_proj``;
- layer rules: a channels-first norm class, ``EmbeddingBag`` with offsets (sum, mean,
  ``padding_idx``, ``per_sample_weights``), parametrizations (``weight_norm`` old and new,
  ``orthogonal``), a layer whose rule raises (torch.func instead);
- the completeness check: a parameter used in the loss, outside the forward, leaves every step
  unmeasured (``Unsupported``), never zeros.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from noisescope.torch import PerExampleNorms
from noisescope.torch._uses import Unsupported

Loss = Callable[[nn.Module, Tensor], Tensor]  # per-example losses of the examples ``idx``


def _truth(model: nn.Module, idx: Tensor, loss: Loss) -> Tensor:
    """(parameters, examples): |grad of example i's loss|^2, one backward per example (before
    the probe's hooks exist: old-style weight_norm cannot be deep-copied)."""
    ref = model
    params = [p for p in ref.parameters() if p.requires_grad]
    rows = []
    for i in idx.tolist():
        grads = torch.autograd.grad(loss(ref, torch.tensor([i])).sum(), params, allow_unused=True)
        rows.append(torch.stack([g.square().sum() if g is not None else 0 * params[0].sum()
                                 for g in grads]))  # fmt: skip
    return torch.stack(rows, 1)


def _measured(model: nn.Module, idx: Tensor, loss: Loss, steps: int = 2) -> list[Tensor]:
    """Each step's per-example squared norms, shape (parameters, examples); raises
    ``Unsupported`` for a step that cannot be measured."""
    params = [p for p in model.parameters() if p.requires_grad]
    norms = PerExampleNorms(model, {id(p): i for i, p in enumerate(params)})
    out = []
    for _ in range(steps):
        norms.armed = True
        loss(model, idx).sum().backward()
        out.append(norms.take(torch.device("cpu")).double())
        model.zero_grad(set_to_none=True)
    norms.remove()
    return out


def _check(model: nn.Module, n: int, loss: Loss) -> None:
    idx = torch.arange(n)
    truth = _truth(model, idx, loss)
    for got in _measured(model, idx, loss):
        torch.testing.assert_close(got, truth, rtol=1e-6, atol=1e-12 * float(truth.max()))


def _sq(model: nn.Module, x: Tensor) -> Loss:
    """Per-example loss: the squared output of each example."""
    return lambda m, idx: m(x[idx]).square().flatten(1).sum(1)


class TiedHead(nn.Module):
    def __init__(self, form: str) -> None:
        super().__init__()
        self.form = form
        self.tok_emb = nn.Embedding(20, 8)
        self.lin = nn.Linear(8, 8)

    def forward(self, ids: Tensor) -> Tensor:
        h = torch.tanh(self.lin(self.tok_emb(ids)))
        if self.form == "F.linear":
            return F.linear(h, self.tok_emb.weight)
        return h @ self.tok_emb.weight.T


class ParentReads(nn.Module):
    """A parent using its children's weights directly: ``W @ x``, ``F.conv1d`` with a depthwise
    conv's weight (and calling the conv too), a norm's gain and a bias read elementwise."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.conv = nn.Conv1d(4, 4, 3, groups=4, padding=1)
        self.ln = nn.LayerNorm(4)
        self.out = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:  # x: (B, 4 channels, 6 positions)
        h = (self.lin.weight @ x).transpose(1, 2) + self.lin(x.transpose(1, 2))
        c = F.conv1d(x, self.conv.weight, self.conv.bias, padding=1, groups=4) + self.conv(x)
        h = self.ln(h + c.transpose(1, 2))
        h = h + torch.tanh(h) * self.ln.weight + self.lin.bias / 3
        out: Tensor = self.out(h)
        return out


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.head(self.enc(x).mean(1))
        return out


class ChannelsFirstNorm(nn.Module):
    """ConvNeXt's LayerNorm over channels of (B, C, H, W): a class named *Norm."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, c))
        self.bias = nn.Parameter(torch.linspace(-0.2, 0.2, c))

    def forward(self, x: Tensor) -> Tensor:
        u = x.mean(1, keepdim=True)
        x = (x - u) / torch.sqrt((x - u).pow(2).mean(1, keepdim=True) + 1e-6)
        return self.weight[:, None, None] * x + self.bias[:, None, None]


class ConvNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 6, 2, stride=2)
        self.norm = ChannelsFirstNorm(6)
        self.head = nn.Linear(6, 2)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.head(self.norm(self.stem(x)).mean((2, 3)))
        return out


class Parametrized(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        utils = nn.utils
        if kind == "weight_norm":
            self.layer: nn.Module = utils.parametrizations.weight_norm(nn.Conv2d(3, 4, 3))
        elif kind == "old_weight_norm":
            self.layer = utils.weight_norm(nn.Conv2d(3, 4, 3))
        else:
            self.layer = utils.parametrizations.orthogonal(nn.Conv2d(3, 4, 3, bias=False))
        self.head = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.head(torch.tanh(self.layer(x)).mean((2, 3)))
        return out


@pytest.mark.parametrize("form", ["F.linear", "matmul"])
def test_a_functionally_tied_head(form: str) -> None:
    torch.manual_seed(0)
    model = TiedHead(form).double()
    ids = torch.randint(0, 20, (5, 6))
    _check(model, 5, _sq(model, ids))


def test_a_parent_using_its_childrens_parameters() -> None:
    torch.manual_seed(1)
    model = ParentReads().double()
    _check(model, 5, _sq(model, torch.randn(5, 4, 6, dtype=torch.float64)))


def test_transformer_encoder_out_proj() -> None:
    torch.manual_seed(2)
    model = Encoder().double()
    _check(model, 4, _sq(model, torch.randn(4, 5, 8, dtype=torch.float64)))


def test_a_channels_first_norm_class() -> None:
    torch.manual_seed(3)
    model = ConvNorm().double()
    params = list(model.parameters())
    norms = PerExampleNorms(model, {id(p): i for i, p in enumerate(params)})
    assert norms.methods["affine_norm"] == 1  # not torch.func: the x_hat identity
    norms.remove()
    _check(model, 4, _sq(model, torch.randn(4, 3, 8, 8, dtype=torch.float64)))


@pytest.mark.parametrize("kind", ["weight_norm", "old_weight_norm", "orthogonal"])
def test_parametrized_layers(kind: str) -> None:
    torch.manual_seed(4)
    model = Parametrized(kind).double()
    _check(model, 4, _sq(model, torch.randn(4, 3, 6, 6, dtype=torch.float64)))


@pytest.mark.parametrize(
    ("mode", "padding", "weighted"),
    [("mean", None, False), ("sum", None, True), ("mean", 0, False)],
)
def test_embedding_bag_with_offsets(mode: str, padding: int | None, weighted: bool) -> None:
    torch.manual_seed(5)
    bag = nn.EmbeddingBag(30, 6, mode=mode, padding_idx=padding).double()
    head = nn.Linear(6, 3).double()
    model = nn.ModuleDict({"bag": bag, "head": head})
    lengths = [3, 1, 5, 2, 4]
    ids = torch.randint(0, 30, (sum(lengths),))
    ids[2] = 0
    weights = torch.rand(sum(lengths), dtype=torch.float64)
    starts = [sum(lengths[:i]) for i in range(len(lengths))]

    class Bags(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, flat: Tensor, offsets: Tensor, w: Tensor | None) -> Tensor:
            out: Tensor = self.m["head"](
                torch.tanh(self.m["bag"](flat, offsets, per_sample_weights=w))
            )
            return out

    bags = Bags()

    def loss(m: nn.Module, idx: Tensor) -> Tensor:
        rows = [torch.arange(starts[i], starts[i] + lengths[i]) for i in idx.tolist()]
        n = torch.tensor([lengths[i] for i in idx.tolist()])
        take = torch.cat(rows)
        w = weights[take] if weighted else None
        out: Tensor = m(ids[take], torch.cumsum(n, 0) - n, w)
        return out.square().sum(1)

    _check(bags, len(lengths), loss)


def test_a_failing_layer_rule_falls_back_to_torch_func(monkeypatch: pytest.MonkeyPatch) -> None:
    """A layer whose identity raises is measured by torch.func, the same step: exact."""
    from noisescope.torch import _layers

    def broken(*args: object) -> object:
        raise RuntimeError("injected")

    monkeypatch.setitem(_layers.RULES, "layernorm", broken)
    torch.manual_seed(6)
    model = nn.Sequential(nn.Linear(4, 5), nn.LayerNorm(5), nn.Linear(5, 2)).double()
    _check(model, 4, _sq(model, torch.randn(4, 3, 4, dtype=torch.float64)))


def test_a_parameter_used_outside_the_forward_leaves_every_step_unmeasured() -> None:
    """A temperature used in the loss: its gradient is not accounted for by the forward."""
    torch.manual_seed(7)
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2)).double()
    temp = nn.Parameter(torch.tensor(1.5, dtype=torch.float64))
    model.register_parameter("temp", temp)
    params = list(model.parameters())
    norms = PerExampleNorms(model, {id(p): i for i, p in enumerate(params)})
    x = torch.randn(4, 4, dtype=torch.float64)
    for _ in range(2):
        norms.armed = True
        (model(x) * temp).square().sum().backward()
        with pytest.raises(Unsupported, match="temp"):
            norms.take(torch.device("cpu"))
        model.zero_grad(set_to_none=True)


class RelativeBias(nn.Module):
    """T5's relative attention bias: an Embedding of (T, T) buckets made from ``arange``, added
    to (B, heads, T, T) scores. With T equal to the batch size the buckets look batch-first by
    their shape; they are not computed from the batch."""

    def __init__(self, t: int, d: int = 4, heads: int = 2) -> None:
        super().__init__()
        self.rel = nn.Embedding(2 * t, heads)
        self.proj = nn.Linear(d, d)
        self.t, self.heads = t, heads

    def forward(self, x: Tensor) -> Tensor:
        pos = torch.arange(self.t)
        buckets = pos[None, :] - pos[:, None] + self.t
        bias = self.rel(buckets).permute(2, 0, 1).unsqueeze(0)  # (1, heads, T, T)
        h = self.proj(x)  # (B, T, d)
        scores = (h @ h.transpose(1, 2)).unsqueeze(1) + bias
        out: Tensor = scores.softmax(-1).sum(1) @ h
        return out


def test_a_batch_less_input_whose_first_dimension_equals_the_batch() -> None:
    torch.manual_seed(8)
    model = RelativeBias(t=5).double()
    _check(model, 5, _sq(model, torch.randn(5, 5, 4, dtype=torch.float64)))
