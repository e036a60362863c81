"""Probe mechanics: per-layer series, AMP un-scaling, non-finite steps, cadence, misuse."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypedDict, cast

import pytest
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

import noisescope
from harness import AppServer, free_port
from noisescope.torch import GradientNoiseProbe, _rows
from tests.probes.lsq_torch import ListSink

if TYPE_CHECKING:
    from typing import Unpack

# TorchDispatchMode.__init__ has no annotations; pyproject.toml's untyped_calls_exclude covers
# calls into torch but not super().__init__(), hence its type: ignore[no-untyped-call].


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 2))


def _data(steps: int, k: int, b: int) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(steps, k, b, 5, generator=g), torch.randn(steps, k, b, 2, generator=g)


def _loss(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    loss: Tensor = (model(x) - y).square().mean()
    return loss


class _StepFloats(TypedDict, total=False):
    """The float keywords of ``GradientNoiseProbe.step``."""

    batch_size: float
    loss: float
    lr: float
    grad_scale: float


def _train(
    model: nn.Module, probe: GradientNoiseProbe, x: Tensor, y: Tensor, **step: Unpack[_StepFloats]
) -> None:
    """``x[i, j]``: micro-batch j of step i; each step accumulates loss / k, then steps the
    probe (with ``step``'s keywords)."""
    steps, k, b = x.shape[:3]
    for i in range(steps):
        for j in range(k):
            (_loss(model, x[i, j], y[i, j]) / k).backward()
            probe.micro_step(batch_size=b)
        probe.step(**step)
        model.zero_grad()


def _micro_grads(model: nn.Module, x: Tensor, y: Tensor, i: int) -> list[tuple[Tensor, ...]]:
    """Step ``i``'s micro-batch gradients, each of its own mean loss (the reference)."""
    params = list(model.parameters())
    return [torch.autograd.grad(_loss(model, x[i, j], y[i, j]), params) for j in range(x.shape[1])]


@pytest.fixture
def read_first_from_grad(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on an accelerator: a step's first backward is read from .grad in one batched call
    when it can be (on the CPU, the default, the hooks measure it like the later ones)."""
    monkeypatch.setattr(_rows, "_PER_PARAMETER", frozenset())


@pytest.fixture(params=["hooks", "batched"])
def first_read(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways of measuring a step's first backward: in the hooks (the CPU's) and, as on an
    accelerator, from .grad in one batched call."""
    if request.param == "batched":
        monkeypatch.setattr(_rows, "_PER_PARAMETER", frozenset())
    return str(request.param)


def test_per_layer_series_match_direct_accumulation_norms() -> None:
    """layers=True: one series per module; each equals the direct per-layer computation."""
    steps, k, b = 3, 3, 4
    model, sink = _mlp(), ListSink()
    ref = copy.deepcopy(model)
    probe = GradientNoiseProbe(model, sink, source="micro", layers=True)
    assert probe.series_names == ["0", "2"]
    x, y = _data(steps, k, b)
    _train(model, probe, x, y)
    for i in range(steps):
        micro = _micro_grads(ref, x, y, i)
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
    x, y = _data(len(heads), k, b)
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
    model = _mlp()
    assert isinstance(model[0].weight, nn.Parameter) and isinstance(model[2].weight, nn.Parameter)
    groups = {"weights": [model[0].weight, model[2].weight]}
    probe = GradientNoiseProbe(model, sink := ListSink(), source="micro", layers=groups)
    _train(model, probe, *_data(1, 2, 4))
    assert {r["series"] for r in sink.rows} == {"", "weights"}
    assert sink.series("weights")[0]["g_big_sq"] < sink.series("")[0]["g_big_sq"]


def _run_amp(use_scaler: bool, tell_probe: bool) -> list[dict[str, float]]:
    model, sink = _mlp(), ListSink()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, enabled=use_scaler)
    probe = GradientNoiseProbe(model, sink, source="micro", scaler=scaler if tell_probe else None)
    x, y = _data(3, 2, 4)
    for i in range(3):
        for j in range(2):
            scaler.scale(_loss(model, x[i, j], y[i, j]) / 2).backward()
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
    model, sink = _mlp(), ListSink()
    probe = GradientNoiseProbe(model, sink, source="micro")
    x, y = _data(4, 2, 4)
    x[1, 0, 0, 0] = float("nan")
    _train(model, probe, x, y)
    assert probe.skipped_steps == 1
    assert [r["step"] for r in sink.series("")] == [0, 2, 3]


def test_every_n_steps_and_examples_counted_on_all_steps() -> None:
    model, sink = _mlp(), ListSink()
    probe = GradientNoiseProbe(model, sink, source="micro", every=2)
    _train(model, probe, *_data(5, 2, 4), loss=1.5, lr=0.01)
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
    model, sink = _mlp(), ListSink()
    probe = GradientNoiseProbe(model, sink)
    assert probe.source == "per_example"
    _train(model, probe, *_data(3, 2, 4))
    assert probe.source == "micro"
    assert [(r["step"], r["b_small"]) for r in sink.series("")] == [(0, 4.0), (1, 4.0), (2, 4.0)]
    said = [line for line in capsys.readouterr().err.splitlines() if "measuring with" in line]
    assert len(said) == 1 and "source='micro'" in said[0]


def test_misuse_gets_clear_errors() -> None:
    model = _mlp()
    probe = GradientNoiseProbe(model, ListSink(), source="micro")
    with pytest.raises(RuntimeError, match="micro_step"):
        probe.step()
    with pytest.raises(ValueError, match="micro_loss"):
        GradientNoiseProbe(model, ListSink(), micro_loss="avg")  # type: ignore[arg-type]
    x, y = _data(1, 1, 4)
    _loss(model, x[0, 0], y[0, 0]).backward()
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

    model = _mlp()
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
        GradientNoiseProbe(_mlp(), ListSink(), units="sequences")  # type: ignore[arg-type]
    assert str(by_run.value) == str(by_probe.value) == said


def test_batchnorm_refuses_a_forced_per_example_source() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    with pytest.raises(ValueError, match="BatchNorm"):
        GradientNoiseProbe(model, ListSink(), source="per_example")


def test_small_batches_first_measures_only_the_first_micro_batch() -> None:
    """small_batches="first": G_small is the first micro-batch; G_big still all of them."""
    steps, k, b = 2, 3, 4
    model, sink = _mlp(), ListSink()
    ref = copy.deepcopy(model)
    probe = GradientNoiseProbe(model, sink, source="micro", small_batches="first")
    x, y = _data(steps, k, b)
    _train(model, probe, x, y)
    for i in range(steps):
        micro = _micro_grads(ref, x, y, i)
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
    model, sink = _mlp(), ListSink()
    ref = copy.deepcopy(model)
    probe = GradientNoiseProbe(model, sink, source="per_example", per_example_max=3)
    x, y = _data(1, 1, 8)
    _loss(model, x[0, 0], y[0, 0]).backward()
    probe.step(batch_size=8)
    per_example = [
        sum(
            float(g.square().sum())
            for g in torch.autograd.grad(
                _loss(ref, x[0, 0, i : i + 1], y[0, 0, i : i + 1]), list(ref.parameters())
            )
        )
        for i in range(3)
    ]
    row = sink.series("")[0]
    assert row["b_small"] == 1
    assert row["b_big"] == 8
    assert row["g_small_sq"] == pytest.approx(sum(per_example) / 3, rel=1e-5)


@pytest.fixture
def norm_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the gradient-norm kernels the probe's hooks launch."""
    calls = [0]
    real = _rows._norm_into

    def counting(dtype: torch.dtype) -> _rows.NormInto:
        norm = real(dtype)

        def counted(grad: Tensor, /, *, out: Tensor) -> object:
            calls[0] += 1
            return norm(grad, out=out)

        return counted

    monkeypatch.setattr(_rows, "_norm_into", counting)
    return calls


class _NormCalls(TorchDispatchMode):
    """Records, for each gradient norm computed in a backward, where its result went."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.outs: list[int | None] = []  # storage address of the out= slot, None if new

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func.overloadpacket is torch.ops.aten.linalg_vector_norm:
            out = kwargs.get("out")
            self.outs.append(None if out is None else out.untyped_storage().data_ptr())
        return func(*args, **kwargs)


def test_hooks_write_norms_into_slots_made_once(first_read: str) -> None:
    """Results kept alive through the later backwards of a step, allocated between their large
    gradient buffers, fragment the heap (page faults every step): the hooks write each norm
    into a slot the probe made once, the same storage every step."""
    steps, k, b = 3, 3, 4
    model, sink = _mlp(), ListSink()
    probe = GradientNoiseProbe(model, sink, source="micro")
    x, y = _data(steps, k, b)
    per_step: list[set[int | None]] = []
    for i in range(steps):
        calls = _NormCalls()
        for j in range(k):
            loss = _loss(model, x[i, j], y[i, j]) / k
            with calls:
                loss.backward()
            probe.micro_step(batch_size=b)
        probe.step()
        model.zero_grad()
        n = len(list(model.parameters()))
        hooked = k - 1 if first_read == "batched" else k  # batched: 1st read from .grad
        assert len(calls.outs) == hooked * n
        per_step.append(set(calls.outs))
    assert None not in per_step[0]
    assert per_step[0] == per_step[1] == per_step[2]
    assert len(sink.series("")) == steps


def test_unmeasured_backwards_compute_nothing(norm_calls: list[int], first_read: str) -> None:
    """every=2 with small_batches="first": only the first backward of a measured step is
    read, and the measured steps match a probe that measures every step."""
    steps, k, b = 4, 3, 4
    model, sink = _mlp(), ListSink()
    twin, twin_sink = copy.deepcopy(model), ListSink()
    probe = GradientNoiseProbe(model, sink, source="micro", every=2, small_batches="first")
    every_step = GradientNoiseProbe(twin, twin_sink, source="micro", small_batches="first")
    x, y = _data(steps, k, b)
    calls = []
    for i in range(steps):
        for j in range(k):
            before = norm_calls[0]
            (_loss(model, x[i, j], y[i, j]) / k).backward()
            probe.micro_step(batch_size=b)
            calls.append(norm_calls[0] - before)
            (_loss(twin, x[i, j], y[i, j]) / k).backward()
            every_step.micro_step(batch_size=b)
        probe.step()
        every_step.step()
        model.zero_grad(set_to_none=False)  # zeroed .grad: hooks, not a read of .grad
        twin.zero_grad(set_to_none=False)
    n = len(list(model.parameters()))
    # hooks on the first backward only; batched, step 0 has no .grad yet: read from .grad
    first = 0 if first_read == "batched" else n
    assert calls == [first, 0, 0, 0, 0, 0, n, 0, 0, 0, 0, 0]
    measured = [r for r in twin_sink.series("") if r["step"] in (0, 2)]
    assert sink.series("") == measured
    probe.remove()
    assert not any(p._backward_hooks for p in model.parameters())


def test_first_backward_read_from_grad_matches_the_hooks(
    norm_calls: list[int], first_read: str
) -> None:
    """Batched: with every .grad None before a step (set_to_none=True), the first backward's
    norms are read from .grad in one batched call; zeroed grads (set_to_none=False) need the
    hooks. Hooks (the CPU's way): every backward through the hooks, no forward hook at all.
    Both give the same samples."""
    steps, k, b = 3, 3, 4
    x, y = _data(steps, k, b)
    rows = {}
    for set_to_none in (True, False):
        model, sink = _mlp(), ListSink()
        n = len(list(model.parameters()))
        probe = GradientNoiseProbe(model, sink, source="micro")
        calls = []
        for i in range(steps):
            for j in range(k):
                before = norm_calls[0]
                (_loss(model, x[i, j], y[i, j]) / k).backward()
                calls.append(norm_calls[0] - before)
                probe.micro_step(batch_size=b)
            probe.step()
            model.zero_grad(set_to_none=set_to_none)
        if first_read == "batched":
            # a fresh model has no .grad at all: its first step never needs the hooks
            assert calls[::k] == [0] + [0 if set_to_none else n] * (steps - 1)
        else:
            assert calls[::k] == [n] * steps
            assert not any(m._forward_pre_hooks for m in model.modules())
        assert all(c == n for j, c in enumerate(calls) if j % k)
        rows[set_to_none] = sink.series("")
    numbers = ("step", "b_small", "b_big", "g_small_sq", "g_big_sq", "examples")
    for read, hooked in zip(rows[True], rows[False], strict=True):
        for name in numbers:
            assert read[name] == pytest.approx(hooked[name], rel=1e-6), name


def test_first_backward_read_from_grad_when_a_submodule_is_called_directly(
    norm_calls: list[int], read_first_from_grad: None
) -> None:
    """Lightning calls ``self.model(...)`` inside training_step, never the probed module's own
    forward: the first backward is still read from .grad, and the numbers match."""

    class Wrapper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = _mlp()

    k, b = 3, 4
    x, y = _data(1, k, b)
    wrapper, sink = Wrapper(), ListSink()
    twin, twin_sink = copy.deepcopy(wrapper.model), ListSink()
    probe = GradientNoiseProbe(wrapper, sink, source="micro")
    reference = GradientNoiseProbe(twin, twin_sink, source="micro")
    calls = []
    for j in range(k):
        before = norm_calls[0]
        (_loss(wrapper.model, x[0, j], y[0, j]) / k).backward()
        calls.append(norm_calls[0] - before)
        probe.micro_step(batch_size=b)
        (_loss(twin, x[0, j], y[0, j]) / k).backward()
        reference.micro_step(batch_size=b)
    probe.step()
    reference.step()
    assert calls[0] == 0
    assert sink.series("") == twin_sink.series("")


@pytest.fixture
def one_process_group() -> Iterator[None]:
    """A gloo group of one process, as ``torchrun --nproc-per-node 1`` sets up."""
    init = f"tcp://127.0.0.1:{free_port()}"
    dist.init_process_group("gloo", init_method=init, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("wrap", ["plain", "ddp"])
def test_first_backward_read_from_grad_in_a_one_process_group(
    one_process_group: None, norm_calls: list[int], read_first_from_grad: None, wrap: str
) -> None:
    """With no peer to all-reduce with, the first backward is read from .grad even outside
    no_sync; later backwards use the hooks; the numbers match a probe outside any group."""
    k, b = 3, 4
    x, y = _data(2, k, b)
    base = _mlp()
    model: nn.Module = copy.deepcopy(base)
    if wrap == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
    sink, twin_sink = ListSink(), ListSink()
    probe = GradientNoiseProbe(model, sink, source="micro")
    twin = copy.deepcopy(base)
    reference = GradientNoiseProbe(twin, twin_sink, source="micro")
    n = len(list(base.parameters()))
    calls = []
    for i in range(2):
        for j in range(k):
            before = norm_calls[0]
            (_loss(model, x[i, j], y[i, j]) / k).backward()
            calls.append(norm_calls[0] - before)
            probe.micro_step(batch_size=b)
            (_loss(twin, x[i, j], y[i, j]) / k).backward()
            reference.micro_step(batch_size=b)
        probe.step()
        reference.step()
        model.zero_grad(set_to_none=True)
        twin.zero_grad(set_to_none=True)
    assert calls == [0, n, n] * 2
    for row, ref in zip(sink.series(""), twin_sink.series(""), strict=True):
        for name in ("b_small", "b_big", "g_small_sq", "g_big_sq"):
            assert row[name] == pytest.approx(ref[name], rel=1e-5), name


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
        _train(model, probe, ids, y)
        assert probe.error is None
        samples.append(sink.series(""))
    dense, sparse_rows = samples
    assert len(sparse_rows) == len(dense) == 3
    for a, b in zip(dense, sparse_rows, strict=True):
        assert b["g_small_sq"] == pytest.approx(a["g_small_sq"], rel=1e-5)
        assert b["g_big_sq"] == pytest.approx(a["g_big_sq"], rel=1e-5)


@pytest.mark.parametrize("source", ["micro", "per_example"])
def test_an_error_inside_the_probe_stops_it_and_training_goes_on_unchanged(
    source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception raised in a gradient hook would abort the user's backward half-way (some
    .grad accumulated, some not). The probe keeps it out of the backward: the model trains
    exactly as without the probe, the probe warns once, says why and measures no more."""
    from noisescope.torch import _factors

    calls = [0]

    def failing_after(n: int, real: Any) -> Any:
        def failing(*args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            if calls[0] > n:
                raise RuntimeError("injected failure")
            return real(*args, **kwargs)

        return failing

    steps, b = 4, 4
    if source == "micro":  # on the CPU, 4 norms in each backward's hooks and 4 at step()
        k = 2
        real = _rows._norm_into
        per_step = 4 * (k + 1)
        monkeypatch.setattr(_rows, "_norm_into", lambda dtype: failing_after(per_step, real(dtype)))
    else:  # two Linear layers per backward
        monkeypatch.setattr(_factors, "lowrank_sq", failing_after(3, _factors.lowrank_sq))
        k = 1
    model, sink = _mlp(), ListSink()
    twin = copy.deepcopy(model)
    probe = GradientNoiseProbe(model, sink, source=source)  # type: ignore[arg-type]
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, twin)]
    x, y = _data(steps, k, b)
    results = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(steps):
            for m, opt in zip((model, twin), opts, strict=True):
                for j in range(k):
                    (_loss(m, x[i, j], y[i, j]) / k).backward()
                    if m is model:
                        probe.micro_step(batch_size=b)
                if m is model:
                    results.append(probe.step())
                opt.step()
                opt.zero_grad()
    stopped = [w for w in caught if "stopped measuring after an error" in str(w.message)]
    assert len(stopped) == 1
    assert stopped[0].category is RuntimeWarning
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(p, q)
    assert probe.error == "RuntimeError: injected failure"
    assert results[0] is not None
    assert results[1:] == [None] * (steps - 1)
    assert [r["step"] for r in sink.series("")] == [0]
    assert probe.examples_seen == steps * k * b


@pytest.mark.parametrize(
    "grads_exist", [False, True], ids=["read after the first backward", "read at the step"]
)
def test_an_error_reading_the_gradients_is_kept_from_the_loop(
    grads_exist: bool, monkeypatch: pytest.MonkeyPatch, read_first_from_grad: None
) -> None:
    """Reading .grad fails in micro_step (a first backward with no .grad before it) or in
    step() (the accumulated gradient): the loop goes on, the probe stops and says why."""

    def broken(self: _rows.NormRows, row: int) -> None:
        raise RuntimeError("injected failure")

    model, sink = _mlp(), ListSink()
    probe = GradientNoiseProbe(model, sink, source="micro")
    monkeypatch.setattr(_rows.NormRows, "read_grad_into", broken)
    if grads_exist:  # then every backward goes through the hooks, .grad is read at the step
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
    x, y = _data(2, 2, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(2):
            model.zero_grad(set_to_none=not grads_exist)
            for j in range(2):
                (_loss(model, x[i, j], y[i, j]) / 2).backward()
                probe.micro_step(batch_size=4)
            assert probe.step() is None
    assert probe.error == "RuntimeError: injected failure"
    assert sum("stopped measuring" in str(w.message) for w in caught) == 1
    assert probe.examples_seen == 16
    assert sink.rows == []


class _EventSink(ListSink):
    """A sink that, like ``noisescope.Run``, also takes events."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[int, str, dict[str, Any]]] = []

    def log_event(self, step: int, kind: str, payload: dict[str, Any] | None = None) -> None:
        self.events.append((step, kind, dict(payload or {})))


def _single_backward_steps(probe: GradientNoiseProbe, model: nn.Module, steps: int) -> None:
    x, y = _data(steps, 1, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(steps):
            _loss(model, x[i, 0], y[i, 0]).backward()
            probe.micro_step(batch_size=4)
            probe.step()
            model.zero_grad()


def test_a_probe_that_cannot_measure_says_why_on_the_runs_page_once() -> None:
    model, sink = _mlp(), _EventSink()
    _single_backward_steps(GradientNoiseProbe(model, sink, source="micro"), model, 3)
    assert sink.rows == []
    [(step, kind, payload)] = sink.events
    assert (step, kind) == (0, "notice")
    assert payload["message"].startswith("this step has one batch size only")
    assert "gradient accumulation" in payload["message"]  # what to do


def test_a_plain_sink_gets_no_notice_and_no_error() -> None:
    model = _mlp()
    _single_backward_steps(GradientNoiseProbe(model, ListSink(), source="micro"), model, 2)


def test_a_probe_stopped_by_an_error_says_why_on_the_runs_page(
    monkeypatch: pytest.MonkeyPatch, read_first_from_grad: None
) -> None:
    def broken(self: _rows.NormRows, row: int) -> None:
        raise RuntimeError("injected failure")

    model, sink = _mlp(), _EventSink()
    probe = GradientNoiseProbe(model, sink, source="micro")
    probe.step_count = 7
    monkeypatch.setattr(_rows.NormRows, "read_grad_into", broken)
    x, y = _data(3, 2, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(3):
            model.zero_grad(set_to_none=True)
            for j in range(2):
                (_loss(model, x[i, j], y[i, j]) / 2).backward()
                probe.micro_step(batch_size=4)
            probe.step()
    [(step, kind, payload)] = sink.events
    assert (step, kind) == (7, "notice")
    assert "stopped measuring at step 7" in payload["message"]
    assert "RuntimeError: injected failure" in payload["message"]


def test_the_notice_reaches_the_server(app_server: AppServer) -> None:
    model = _mlp()
    run = noisescope.init(
        app_server.url, project="p", task="t", quiet=True, transport=app_server.transport()
    )
    _single_backward_steps(GradientNoiseProbe(model, run, source="micro"), model, 3)
    run.finish()
    events = app_server.client().get(f"/api/v1/runs/{run.id}/events").json()
    assert [e["kind"] for e in events] == ["notice"]
    assert "one batch size only" in events[0]["payload"]["message"]
