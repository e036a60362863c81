"""Probe mechanics: per-layer series, AMP un-scaling, non-finite steps, cadence, misuse."""

from __future__ import annotations

import copy
import warnings
from typing import cast

import pytest
import torch
from torch import Tensor, nn

import noisescope
from noisescope.torch import GradientNoiseProbe
from tests.probes.lsq_torch import ListSink
from tests.probes.small_loop import data, loss_of, micro_grads, mlp, train


def test_per_layer_series_match_direct_accumulation_norms() -> None:
    """layers=True: one series per module; each equals the direct per-layer computation."""
    steps, k, b = 3, 3, 4
    model, sink = mlp(), ListSink()
    ref = copy.deepcopy(model)
    probe = GradientNoiseProbe(model, sink, source="micro", layers=True)
    assert probe.series_names == ["0", "2"]
    x, y = data(steps, k, b)
    train(model, probe, x, y)
    for i in range(steps):
        micro = micro_grads(ref, x, y, i)
        for series, idx in (("0", [0, 1]), ("2", [2, 3])):
            small = sum(float(sum(m[p].square().sum() for p in idx)) for m in micro) / k
            # cast: typeshed types a sum() of tensors Tensor | Literal[0] (0 for no terms)
            big = float(
                sum((cast(Tensor, sum(m[p] for m in micro)) / k).square().sum() for p in idx)
            )
            row = next(r for r in sink.series(series) if r["step"] == i)
            assert row["g_small_sq"] == pytest.approx(small, rel=1e-5)
            assert row["g_big_sq"] == pytest.approx(big, rel=1e-5)
        total = sink.series("")[i]
        parts = [r for r in sink.rows if r["step"] == i and r["series"]]
        assert total["g_small_sq"] == pytest.approx(sum(r["g_small_sq"] for r in parts), rel=1e-6)
        assert total["g_big_sq"] == pytest.approx(sum(r["g_big_sq"] for r in parts), rel=1e-6)


class _TwoHeads(nn.Module):
    """A branch some micro-batches skip (as a mixture-of-experts expert is)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Linear(5, 8)
        self.heads = nn.ModuleList([nn.Linear(8, 2), nn.Linear(8, 2)])

    def forward(self, x: Tensor, head: int) -> Tensor:
        out: Tensor = self.heads[head](torch.tanh(self.body(x)))
        return out


@pytest.mark.parametrize("layers", [False, True], ids=["whole model", "per layer"])
def test_a_parameter_without_a_gradient_adds_nothing(first_read: str, layers: bool) -> None:
    """A head that sits a backward out adds nothing to that micro-batch's norm, even where it
    had one at an earlier step; a head with no .grad at all adds nothing to the step's."""
    heads = [(0, 1), (1, 0), (0, 0)]  # per step, each micro-batch's head; step 2 never uses 1
    k, b = 2, 4
    x, y = data(len(heads), k, b)
    model, sink = _TwoHeads(), ListSink()
    ref = copy.deepcopy(model)
    probe = GradientNoiseProbe(model, sink, source="micro", layers=layers)
    for i, step_heads in enumerate(heads):
        for j, head in enumerate(step_heads):
            ((model(x[i, j], head) - y[i, j]).square().mean() / k).backward()
            probe.micro_step(batch_size=b)
        probe.step()
        model.zero_grad()
    params = list(ref.parameters())
    for i, step_heads in enumerate(heads):
        micro = [
            torch.autograd.grad(
                (ref(x[i, j], head) - y[i, j]).square().mean(), params, allow_unused=True
            )
            for j, head in enumerate(step_heads)
        ]
        small = sum(float(sum(g.square().sum() for g in m if g is not None)) for m in micro) / k
        big = 0.0
        for grads in zip(*micro, strict=True):
            present = [g for g in grads if g is not None]
            if present:
                big += float((sum(present) / k).square().sum())
        row = sink.series("")[i]
        assert row["g_small_sq"] == pytest.approx(small, rel=1e-5)
        assert row["g_big_sq"] == pytest.approx(big, rel=1e-5)


@pytest.mark.parametrize("set_to_none", [True, False], ids=["read-from-grad", "hooks"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_every_parameter_dtype_is_reduced_in_fp32_or_better(
    dtype: torch.dtype, set_to_none: bool, first_read: str
) -> None:
    """Half-precision gradients are squared and summed in fp32 (their own dtype would round
    or overflow), fp64 ones in fp64 (kept as fp32); a first backward read from .grad and one
    read by the hooks both agree with autograd."""
    steps, k, b = 2, 2, 4
    torch.manual_seed(0)
    model, sink = nn.Linear(5, 3).to(dtype), ListSink()
    ref = copy.deepcopy(model)
    probe = GradientNoiseProbe(model, sink, source="micro", micro_loss="mean")
    x = torch.randn(steps, k, b, 5).to(dtype)

    def loss(m: nn.Module, xb: Tensor) -> Tensor:
        out: Tensor = m(xb).float().square().mean()
        return out

    for i in range(steps):
        for j in range(k):
            loss(model, x[i, j]).backward()
            probe.micro_step(batch_size=b)
        probe.step()
        model.zero_grad(set_to_none=set_to_none)
    for i in range(steps):
        micro = [torch.autograd.grad(loss(ref, x[i, j]), list(ref.parameters())) for j in range(k)]
        small = sum(float(sum(g.double().square().sum() for g in m)) for m in micro) / k
        # "mean": c_j = 1, the optimizer's gradient is the sum, accumulated in the model's dtype
        big = float(sum((sum(gs) / k).double().square().sum() for gs in zip(*micro, strict=True)))
        row = sink.series("")[i]
        assert row["g_small_sq"] == pytest.approx(small, rel=1e-5)
        assert row["g_big_sq"] == pytest.approx(big, rel=1e-5)


def test_named_parameter_groups() -> None:
    model = mlp()
    assert isinstance(model[0].weight, nn.Parameter) and isinstance(model[2].weight, nn.Parameter)
    groups = {"weights": [model[0].weight, model[2].weight]}
    probe = GradientNoiseProbe(model, sink := ListSink(), source="micro", layers=groups)
    train(model, probe, *data(1, 2, 4))
    assert {r["series"] for r in sink.rows} == {"", "weights"}
    assert sink.series("weights")[0]["g_big_sq"] < sink.series("")[0]["g_big_sq"]


def _run_amp(use_scaler: bool, tell_probe: bool) -> list[dict[str, float]]:
    model, sink = mlp(), ListSink()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, enabled=use_scaler)
    probe = GradientNoiseProbe(model, sink, source="micro", scaler=scaler if tell_probe else None)
    x, y = data(3, 2, 4)
    for i in range(3):
        for j in range(2):
            scaler.scale(loss_of(model, x[i, j], y[i, j]) / 2).backward()
            probe.micro_step(batch_size=4)
        probe.step()
        model.zero_grad()
    return sink.series("")


def test_amp_loss_scale_is_divided_out() -> None:
    plain = _run_amp(use_scaler=False, tell_probe=False)
    scaled = _run_amp(use_scaler=True, tell_probe=True)
    for a, b in zip(plain, scaled, strict=True):
        assert b["g_small_sq"] == pytest.approx(a["g_small_sq"], rel=1e-5)
        assert b["g_big_sq"] == pytest.approx(a["g_big_sq"], rel=1e-5)
    # without the scaler the norms would be scale^2 too large: the test can tell
    wrong = _run_amp(use_scaler=True, tell_probe=False)
    assert wrong[0]["g_big_sq"] == pytest.approx(plain[0]["g_big_sq"] * 2.0**20, rel=1e-4)


def test_non_finite_steps_are_skipped_and_counted() -> None:
    model, sink = mlp(), ListSink()
    probe = GradientNoiseProbe(model, sink, source="micro")
    x, y = data(4, 2, 4)
    x[1, 0, 0, 0] = float("nan")
    train(model, probe, x, y)
    assert probe.skipped_steps == 1
    assert [r["step"] for r in sink.series("")] == [0, 2, 3]


def test_every_n_steps_and_examples_counted_on_all_steps() -> None:
    model, sink = mlp(), ListSink()
    probe = GradientNoiseProbe(model, sink, source="micro", every=2)
    train(model, probe, *data(5, 2, 4), loss=1.5, lr=0.01)
    rows = sink.series("")
    assert [r["step"] for r in rows] == [0, 2, 4]
    assert [r["examples"] for r in rows] == [8, 24, 40]
    assert rows[0]["loss"] == 1.5
    assert rows[0]["lr"] == 0.01


def test_auto_switches_from_per_example_to_micro_batches(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Auto decides before it logs: the first step's 2 backwards make it a micro-batch step (both
    sources' hooks ran while the probe did not know yet), every row is a micro-batch row and
    the one announcement names micro-batches."""
    model, sink = mlp(), ListSink()
    probe = GradientNoiseProbe(model, sink)
    assert probe.source == "per_example"
    train(model, probe, *data(3, 2, 4))
    assert probe.source == "micro"
    assert [(r["step"], r["b_small"]) for r in sink.series("")] == [(0, 4.0), (1, 4.0), (2, 4.0)]
    said = [line for line in capsys.readouterr().err.splitlines() if "measuring with" in line]
    assert len(said) == 1 and "source='micro'" in said[0]


def test_misuse_gets_clear_errors() -> None:
    model = mlp()
    probe = GradientNoiseProbe(model, ListSink(), source="micro")
    with pytest.raises(RuntimeError, match="micro_step"):
        probe.step()
    with pytest.raises(ValueError, match="micro_loss"):
        GradientNoiseProbe(model, ListSink(), micro_loss="avg")  # type: ignore[arg-type]
    x, y = data(1, 1, 4)
    loss_of(model, x[0, 0], y[0, 0]).backward()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert probe.step(batch_size=4) is None
    assert any("one batch size only" in str(w.message) for w in caught)


def test_sink_contract_matches_noisescope_run() -> None:
    """The probe calls Run.log_sample; its signature must stay the one the probe uses."""
    import inspect

    import noisescope
    from noisescope.torch import Sink

    run_params = list(inspect.signature(noisescope.Run.log_sample).parameters)
    assert run_params == list(inspect.signature(Sink.log_sample).parameters)


def test_units_follow_the_run_and_mismatch_is_refused() -> None:
    class TokenSink(ListSink):
        units = "tokens"

    model = mlp()
    assert GradientNoiseProbe(model, TokenSink(), source="micro").units == "tokens"
    with pytest.raises(ValueError, match="units"):
        GradientNoiseProbe(model, TokenSink(), source="micro", units="examples")


def test_unknown_units_get_the_runs_message() -> None:
    """One rule (``protocol.units_problem``) for the run, the probe and the framework callbacks."""
    from noisescope.protocol import units_problem

    said = "units must be 'examples' or 'tokens', got 'sequences'"
    assert units_problem("sequences") == said and units_problem("tokens") is None
    with pytest.raises(ValueError, match="units must be") as by_run:
        noisescope.init(mode="disabled", units="sequences")
    with pytest.raises(ValueError, match="units must be") as by_probe:
        GradientNoiseProbe(mlp(), ListSink(), units="sequences")  # type: ignore[arg-type]
    assert str(by_run.value) == str(by_probe.value) == said


def test_batchnorm_refuses_a_forced_per_example_source() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    with pytest.raises(ValueError, match="BatchNorm"):
        GradientNoiseProbe(model, ListSink(), source="per_example")


def test_small_batches_first_measures_only_the_first_micro_batch() -> None:
    """small_batches="first": G_small is the first micro-batch; G_big still all of them."""
    steps, k, b = 2, 3, 4
    model, sink = mlp(), ListSink()
    ref = copy.deepcopy(model)
    probe = GradientNoiseProbe(model, sink, source="micro", small_batches="first")
    x, y = data(steps, k, b)
    train(model, probe, x, y)
    for i in range(steps):
        micro = micro_grads(ref, x, y, i)
        row = sink.series("")[i]
        assert row["b_small"] == b
        assert row["b_big"] == k * b
        assert row["g_small_sq"] == pytest.approx(
            float(sum(g.square().sum() for g in micro[0])), rel=1e-5
        )
        # cast: typeshed types a sum() of tensors Tensor | Literal[0] (0 for no terms)
        big = sum(
            float((cast(Tensor, sum(m[p] for m in micro)) / k).square().sum()) for p in range(4)
        )
        assert row["g_big_sq"] == pytest.approx(big, rel=1e-5)


def test_per_example_max_measures_a_subset_with_the_full_batch_normalisation() -> None:
    """per_example_max=3: the first 3 examples' norms, scaled as members of the batch of 8."""
    model, sink = mlp(), ListSink()
    ref = copy.deepcopy(model)
    probe = GradientNoiseProbe(model, sink, source="per_example", per_example_max=3)
    x, y = data(1, 1, 8)
    loss_of(model, x[0, 0], y[0, 0]).backward()
    probe.step(batch_size=8)
    per_example = [
        sum(
            float(g.square().sum())
            for g in torch.autograd.grad(
                loss_of(ref, x[0, 0, i : i + 1], y[0, 0, i : i + 1]), list(ref.parameters())
            )
        )
        for i in range(3)
    ]
    row = sink.series("")[0]
    assert row["b_small"] == 1
    assert row["b_big"] == 8
    assert row["g_small_sq"] == pytest.approx(sum(per_example) / 3, rel=1e-5)


def _embedding_model(sparse: bool) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(20, 4, sparse=sparse), nn.Flatten(), nn.Linear(12, 2))


@pytest.mark.parametrize(("source", "k"), [("micro", 3), ("per_example", 1)])
def test_sparse_embedding_gradients_are_measured_like_dense_ones(
    source: str, k: int, first_read: str
) -> None:
    """nn.Embedding(sparse=True) gives sparse gradients (uncoalesced once accumulated): their
    norms, by hook, from .grad and per example, equal those of the same dense model."""
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 20, (3, k, 5, 3), generator=g)  # repeated ids within and across
    y = torch.randn(3, k, 5, 2, generator=g)
    samples = []
    for sparse in (False, True):
        model, sink = _embedding_model(sparse), ListSink()
        probe = GradientNoiseProbe(model, sink, source=source)  # type: ignore[arg-type]
        train(model, probe, ids, y)
        assert probe.error is None
        samples.append(sink.series(""))
    dense, sparse_rows = samples
    assert len(sparse_rows) == len(dense) == 3
    for a, b in zip(dense, sparse_rows, strict=True):
        assert b["g_small_sq"] == pytest.approx(a["g_small_sq"], rel=1e-5)
        assert b["g_big_sq"] == pytest.approx(a["g_big_sq"], rel=1e-5)
