"""Per-example squared gradient norms (B_small = 1) against brute force, layer by layer.

Brute force: one autograd.grad per example of (loss_i / B) on an unhooked copy of the model.
The cheap identities (Linear with and without sequence dimension, both the Gram and the
outer-product branch; Conv1d, Conv2d; Embedding with repeated ids and padding_idx; LayerNorm)
and the torch.func fallback must agree with it to 1e-4 relative.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn

from noisescope.torch import GradientNoiseProbe, PerExampleNorms
from tests.probes.lsq_torch import ListSink


class Scale(nn.Module):
    """A module with a raw parameter and no cheap identity: exercises the torch.func fallback."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.linspace(0.5, 1.5, d))

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(x * self.gain)


class SeqModel(nn.Module):
    def __init__(self, vocab: int = 11, d: int = 16, t_proj: int = 4) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d, padding_idx=0)
        self.ln = nn.LayerNorm(d)
        self.scale = Scale(d)
        self.proj = nn.Linear(d, d)  # T=6: Gram branch (6 * 32 <= 256)
        self.narrow = nn.Linear(d, t_proj)  # outer-product branch (6 * 20 > 64)
        self.head = nn.Linear(t_proj * 6, 3)  # no sequence dimension (T = 1)

    def forward(self, ids: Tensor) -> Tensor:
        h = self.scale(self.ln(self.emb(ids)))
        h = torch.relu(self.proj(h))
        h = self.narrow(h)
        out: Tensor = self.head(h.flatten(1))
        return out


class ConvModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv1d(2, 3, kernel_size=3, padding=2, dilation=2)
        self.c2 = nn.Conv2d(1, 4, kernel_size=3, stride=2, padding=1)
        self.c2_nobias = nn.Conv2d(4, 2, kernel_size=2, bias=False)
        self.out = nn.Linear(3 * 10 + 2 * 3 * 3, 2)

    def forward(self, xs: tuple[Tensor, Tensor]) -> Tensor:
        a = torch.relu(self.c1(xs[0])).flatten(1)
        b = self.c2_nobias(torch.relu(self.c2(xs[1]))).flatten(1)
        out: Tensor = self.out(torch.cat([a, b], 1))
        return out


def _brute_force(
    model: nn.Module, inputs: object, loss_per_example: Callable[[Tensor], Tensor], batch: int
) -> dict[str, Tensor]:
    """Per-parameter per-example |grad(loss_i / B)|^2 by one autograd.grad per example."""
    ref = copy.deepcopy(model)
    params = dict(ref.named_parameters())
    losses = loss_per_example(ref(inputs))
    out = {name: torch.zeros(batch, dtype=torch.float64) for name in params}
    for i in range(batch):
        grads = torch.autograd.grad(losses[i] / batch, list(params.values()), retain_graph=True)
        for name, g in zip(params, grads, strict=True):
            out[name][i] = g.double().square().sum()
    return out


def _hooked(
    model: nn.Module,
    inputs: object,
    loss_per_example: Callable[[Tensor], Tensor],
    method: str,
) -> dict[str, Tensor]:
    names = [n for n, _ in model.named_parameters()]
    index = {id(p): i for i, (_, p) in enumerate(model.named_parameters())}
    norms = PerExampleNorms(model, index, method)  # type: ignore[arg-type]
    norms.armed = True
    # torch's Tensor.backward has no annotations: an "untyped call" to mypy
    loss_per_example(model(inputs)).mean().backward()
    table = norms.take(torch.device("cpu"))
    norms.remove()
    return {name: table[i].double() for i, name in enumerate(names)}


@pytest.mark.parametrize(
    ("method", "vocab"),
    [("auto", 11), ("auto", 5), ("func", 11)],
    # Embedding: more ids than positions, and fewer
    ids=["identities", "identities-small-vocabulary", "func"],
)
def test_sequence_model_layers_match_brute_force(method: str, vocab: int) -> None:
    torch.manual_seed(0)
    model = SeqModel(vocab=vocab).double()
    ids = torch.randint(0, vocab, (5, 6))
    ids[0, :3] = 3  # repeated ids within an example
    ids[1, 4:] = 0  # padding_idx tokens get no gradient
    target = torch.randint(0, 3, (5,))

    def loss_pe(logits: Tensor) -> Tensor:
        return nn.functional.cross_entropy(logits, target, reduction="none")

    expected = _brute_force(model, ids, loss_pe, 5)
    got = _hooked(model, ids, loss_pe, method)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-4, atol=1e-12, msg=name)


def test_auto_uses_identities_and_func_only_where_needed() -> None:
    model = SeqModel()
    index = {id(p): i for i, p in enumerate(model.parameters())}
    methods = PerExampleNorms(model, index, "auto").methods
    assert methods == {"embedding": 1, "layernorm": 1, "func": 1, "linear": 3}
    with pytest.raises(ValueError, match="no cheap per-example identity"):
        PerExampleNorms(model, index, "identities")


def test_conv_layers_match_brute_force() -> None:
    torch.manual_seed(1)
    model = ConvModel().double()
    xs = (torch.randn(4, 2, 10, dtype=torch.float64), torch.randn(4, 1, 8, 8, dtype=torch.float64))
    target = torch.randn(4, 2, dtype=torch.float64)

    def loss_pe(out: Tensor) -> Tensor:
        return (out - target).square().sum(1)

    expected = _brute_force(model, xs, loss_pe, 4)
    got = _hooked(model, xs, loss_pe, "identities")
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-4, atol=1e-12, msg=name)


class TinyGPT(nn.Module):
    """nanoGPT's layout in miniature: positions ``arange(T)`` broadcast over the batch, the
    embedding tied to the head, blocks optionally checkpointed, one block called twice."""

    def __init__(self, vocab: int = 13, d: int = 8, t: int = 6, checkpoint: bool = False):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(t, d)
        self.ln = nn.LayerNorm(d)
        self.fc = nn.Linear(d, d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.wte.weight = self.head.weight
        self.checkpoint = checkpoint

    def block(self, x: Tensor) -> Tensor:
        return x + torch.tanh(self.fc(self.ln(x)))

    def forward(self, idx: Tensor) -> Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for _ in range(2):  # the same block twice: its parameters have two uses
            if self.checkpoint:
                x = torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=False)
            else:
                x = self.block(x)
        out: Tensor = self.head(x)
        return out


@pytest.mark.parametrize("batch", [5, 6], ids=["batch-5", "batch-equals-T"])
@pytest.mark.parametrize("checkpoint", [False, True], ids=["plain", "checkpointed"])
def test_tied_broadcast_reused_and_checkpointed_layers_match_brute_force(
    batch: int, checkpoint: bool
) -> None:
    """Cross terms between the uses of one parameter (tied embedding and head, a block called
    twice), positions broadcast over the batch, recomputed forwards counted once."""
    torch.manual_seed(2)
    model = TinyGPT(checkpoint=checkpoint).double()
    ids = torch.randint(0, 13, (batch, 6))
    target = torch.randint(0, 13, (batch, 6))

    def loss_pe(logits: Tensor) -> Tensor:
        per_token = nn.functional.cross_entropy(
            logits.reshape(-1, 13), target.reshape(-1), reduction="none"
        )
        return per_token.reshape(batch, 6).mean(1)

    expected = _brute_force(model, ids, loss_pe, batch)
    got = _hooked(model, ids, loss_pe, "auto")
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-6, atol=1e-14, msg=name)


class Routed(nn.Module):
    """Top-1 routing to two experts, each fed only its tokens (``x[mask]``)."""

    def __init__(self, d: int = 4) -> None:
        super().__init__()
        self.router = nn.Linear(d, 2)
        self.experts = nn.ModuleList([nn.Linear(d, d), nn.Linear(d, d)])

    def forward(self, x: Tensor) -> Tensor:
        choice = self.router(x).argmax(-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            mask = choice == e
            out[mask] = expert(x[mask])
        return out.sum(-1)


def test_rows_that_are_not_examples_are_reported_never_guessed() -> None:
    """An expert fed the routed tokens sees rows that are not the batch's examples: auto
    says so once, logs nothing wrong and moves to micro-batches; nothing reaches the loop."""
    torch.manual_seed(3)
    model, sink = Routed(), ListSink()
    probe = GradientNoiseProbe(model, sink)
    assert probe.source == "per_example"

    def step(k: int) -> None:
        for _ in range(k):  # k = 2, accumulation: the micro source measures
            (model(torch.randn(6, 3, 4)).square().mean() / k).backward()
            probe.micro_step(batch_size=6)
        probe.step()
        model.zero_grad(set_to_none=True)

    with pytest.warns(UserWarning, match="cannot be computed exactly"):
        step(1)  # one backward: per-example was the source, and it cannot be exact
    step(2)
    assert probe.source == "micro" and probe.error is None
    assert "cannot be computed exactly" in probe.source_reason
    assert [r["step"] for r in sink.series("")] == [1]  # the first step is not logged


def test_forced_per_example_on_an_unsupported_layout_stops_with_the_reason() -> None:
    model = Routed()
    probe = GradientNoiseProbe(model, ListSink(), source="per_example")
    model(torch.randn(6, 3, 4)).square().mean().backward()
    with pytest.warns(RuntimeWarning, match="stopped measuring"):
        probe.step(batch_size=6)
    assert probe.error is not None and "not the batch's examples" in probe.error


def test_auto_with_batchnorm_uses_micro_batches_and_says_why() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    probe = GradientNoiseProbe(model, ListSink())
    assert probe.source == "micro" and "BatchNorm" in probe.source_reason


class RMSNorm(nn.Module):
    """A model's own RMS norm class (Llama's, T5's): ``weight * x_hat``; ``shifted``: Gemma's
    ``(1 + weight) * x_hat``, which is not ``weight * x_hat + bias``."""

    def __init__(self, d: int, shifted: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, d))
        self.shifted = shifted

    def forward(self, x: Tensor) -> Tensor:
        x_hat = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6)
        return (1 + self.weight) * x_hat if self.shifted else self.weight * x_hat


@pytest.mark.parametrize("shifted", [False, True], ids=["weight-times-x-hat", "one-plus-weight"])
def test_a_models_own_norm_class_is_checked_then_measured(shifted: bool) -> None:
    """Norm classes of a model's own (nanoGPT's LayerNorm, LlamaRMSNorm) get the cheap x_hat
    identity once their output is checked to be weight * x_hat (+ bias); one that is not
    falls back to torch.func. Both match brute force, over two backwards."""
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(4, 6), RMSNorm(6, shifted), nn.Linear(6, 2)).double()
    names = [n for n, _ in model.named_parameters()]
    index = {id(p): i for i, p in enumerate(model.parameters())}

    def loss_pe(out: Tensor) -> Tensor:
        return out.square().sum((1, 2))

    xs = [torch.randn(5, 3, 4, dtype=torch.float64) for _ in range(2)]
    truth = [_brute_force(model, x, loss_pe, 5) for x in xs]  # before the hooks (deepcopy)
    norms = PerExampleNorms(model, index)
    assert norms.methods == {"linear": 2, "affine_norm": 1}
    norms.armed = True
    for x, expected in zip(xs, truth, strict=True):
        loss_pe(model(x)).mean().backward()
        table = norms.take(torch.device("cpu"))
        for i, name in enumerate(names):
            torch.testing.assert_close(
                table[i].double(), expected[name], rtol=1e-6, atol=1e-14, msg=name
            )
    assert norms.methods == {"linear": 2, ("func" if shifted else "affine_norm"): 1}


class BareParameters(nn.Module):
    """A container's own parameters used between its children: a position table sliced and
    added (experiments' byte LM), a cls token expanded over the batch and a position table of
    shape (1, T, d) (ViT), a layer-scale vector over positions (CaiT, ConvNeXt)."""

    def __init__(self, d: int = 6, t: int = 4) -> None:
        super().__init__()
        self.proj = nn.Linear(3, d)
        self.pos = nn.Parameter(torch.randn(t + 2, d))
        self.cls = nn.Parameter(torch.randn(1, 1, d))
        self.vit_pos = nn.Parameter(torch.randn(1, t + 1, d))
        self.fc = nn.Linear(d, d)
        self.gamma = nn.Parameter(torch.rand(d))
        self.head = nn.Linear(d, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = self.proj(x) + self.pos[: x.shape[1]]
        h = torch.cat([self.cls.expand(x.shape[0], -1, -1), h], 1) + self.vit_pos
        h = h + self.gamma * torch.tanh(self.fc(h))
        out: Tensor = self.head(h).sum(1)
        return out


def test_a_containers_own_parameters_match_brute_force() -> None:
    torch.manual_seed(5)
    model = BareParameters().double()
    x = torch.randn(5, 4, 3, dtype=torch.float64)
    target = torch.randint(0, 2, (5,))

    def loss_pe(out: Tensor) -> Tensor:
        return nn.functional.cross_entropy(out, target, reduction="none")

    expected = _brute_force(model, x, loss_pe, 5)
    got = _hooked(model, x, loss_pe, "auto")
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-6, atol=1e-14, msg=name)


class MatmulParameter(nn.Module):
    """A container's own matrix used in a matmul: not followed to the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.w = nn.Parameter(torch.randn(4, 2))

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = (torch.tanh(self.fc(x)) @ self.w).sum(1)
        return out


def test_a_parameter_not_followed_to_the_batch_moves_to_torch_func() -> None:
    """torch.func over the container measures it from the call where the probe meets the use
    (issue 54: the container's forward hook still sees that call), so every step is logged,
    nothing said; and its norms are exact (brute force)."""
    torch.manual_seed(6)
    model, sink = MatmulParameter(), ListSink()
    probe = GradientNoiseProbe(model, sink)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            model.zero_grad(set_to_none=True)
            model(torch.randn(5, 3, 4)).square().mean().backward()
            probe.step(batch_size=5)
    assert probe.source == "per_example" and probe.error is None
    assert [r["step"] for r in sink.series("")] == [0, 1, 2]
    probe.remove()
    x = torch.randn(5, 3, 4)

    def loss_pe(out: Tensor) -> Tensor:
        return out.square().mean(1)

    expected = _brute_force(model, x, loss_pe, 5)
    got = _hooked(model, x, loss_pe, "auto")
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-6, atol=1e-12, msg=name)


class Escaping(nn.Module):
    """Positions broadcast over the batch; with ``escape``, also fed to ``torch.cat`` inside a
    list, where the probe does not see them: part of their gradient goes unseen."""

    def __init__(self) -> None:
        super().__init__()
        self.wpe = nn.Embedding(3, 4)
        self.fc = nn.Linear(4, 1)
        self.escape = False

    def forward(self, x: Tensor) -> Tensor:
        pos = self.wpe(torch.arange(3))
        h = x + pos
        if self.escape:
            h = h + torch.cat([pos, pos]).sum()
        out: Tensor = self.fc(h).sum((1, 2))
        return out


@pytest.mark.parametrize("escape_at", [0, 4], ids=["from-the-start", "after-the-checked-steps"])
def test_a_gradient_that_bypasses_the_broadcast_is_never_logged(escape_at: int) -> None:
    """The examples' gradients of a batch-less output must add up to its gradient. Checked on
    the host in the first steps (auto then moves to micro-batches, saying why); later on the
    device, where a gap makes that step's norms NaN: skipped and counted, never logged."""
    torch.manual_seed(7)
    model, sink = Escaping(), ListSink()
    probe = GradientNoiseProbe(model, sink)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(6):
            model.escape = step >= escape_at
            model(torch.randn(5, 3, 4)).square().mean().backward()
            probe.step(batch_size=5)
            model.zero_grad(set_to_none=True)
    steps = [r["step"] for r in sink.series("")]
    if escape_at == 0:
        assert steps == [] and probe.source == "micro"
        assert any("other than through a broadcast" in str(w.message) for w in caught)
    else:
        assert steps == [0, 1, 2, 3] and probe.skipped_steps == 2 and probe.error is None


def test_auto_under_accumulation_announces_one_source(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 56 item 12: a loop with several backwards per step was told "source='per_example'"
    at its first step and "source='micro'" at its second; it is told the one it measures with."""
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    probe = GradientNoiseProbe(model, ListSink())
    for _ in range(3):
        for _ in range(2):
            (model(torch.randn(6, 4)).square().mean() / 2).backward()
            probe.micro_step(batch_size=6)
        probe.step()
        model.zero_grad(set_to_none=True)
    said = [line for line in capsys.readouterr().err.splitlines() if "measuring with" in line]
    assert len(said) == 1 and "source='micro'" in said[0], said
