"""bf16 (autocast, and bf16 weights) with each source against the closed form; torch.compile
(inductor on the CPU) logging the eager samples, without a graph break from the micro source.

Ground truth as in ``test_sources_truth``: fixed seeds, B_simple within 3% at the stated steps
(per-example: 400 steps of 128 examples; accumulation: 400 steps of 4 x 32). bf16 weights
shift the truth to the rounded weights: it is computed there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from noisescope.torch import GradientNoiseProbe
from tests.estimators.lsq_truth import LeastSquares
from tests.probes.lsq_torch import ListSink, lsq_model
from tests.probes.test_sources_truth import assert_truth
from tests.support.dynamo import compiled_counts

STEPS = 400
#: source -> (micro-batches per step, examples per micro-batch)
SHAPES = {"per_example": (1, 128), "micro": (4, 32)}


def _problem(d: int) -> tuple[LeastSquares, np.ndarray]:
    p = LeastSquares.make(d=d, sigma=0.5, seed=0)
    return p, p.w_star + 0.6 * np.random.default_rng(1).normal(size=p.d)


def _train(
    model: nn.Module,
    sink: ListSink,
    p: LeastSquares,
    source: str,
    steps: int,
    dtype: torch.dtype,
    autocast: bool,
    forward: Callable[[Tensor], Tensor] | None = None,
) -> GradientNoiseProbe:
    k, b = SHAPES[source]
    call = forward if forward is not None else model
    probe = GradientNoiseProbe(call, sink, source=source)  # type: ignore[arg-type]
    x_all, y_all = p.sample(np.random.default_rng(7), (steps, k, b))
    for i in range(steps):
        x, y = torch.from_numpy(x_all[i]).to(dtype), torch.from_numpy(y_all[i]).to(dtype)
        for j in range(k):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                out = call(x[j]).squeeze(-1)
            loss = 0.5 * (out.float() - y[j].float()).square().mean()
            (loss / k).backward()
            if j < k - 1:
                probe.micro_step(batch_size=b)
        probe.step(batch_size=b)
        model.zero_grad()
    return probe


@pytest.mark.parametrize("source", list(SHAPES))
@pytest.mark.parametrize("mode", ["autocast", "weights"])
def test_bf16_matches_closed_form(source: str, mode: str) -> None:
    p, w = _problem(32)
    model = lsq_model(p, w).float()
    if mode == "weights":
        model = model.to(torch.bfloat16)
        w = model.weight.detach().double().flatten().numpy()  # the truth at the rounded weights
    sink = ListSink()
    dtype = torch.bfloat16 if mode == "weights" else torch.float32
    probe = _train(model, sink, p, source, STEPS, dtype, autocast=mode == "autocast")
    assert probe.source == source and probe.error is None
    assert len(sink.rows) == STEPS
    assert_truth(sink.rows, p.truth(w))


@pytest.mark.parametrize("source", list(SHAPES))
def test_compiled_model_logs_the_eager_samples(source: str) -> None:
    """Inductor on the CPU: the same samples as eager. The micro source's hooks are on the
    parameters (outside the graph): no graph break. Per-example hooks sit inside the forward:
    one graph break per hooked layer (docs/sources.md says so; the cost is benchmarked)."""
    p, w = _problem(8)
    rows: dict[bool, list[dict[str, Any]]] = {}
    for compiled in (False, True):
        model, sink = lsq_model(p, w), ListSink()
        forward = torch.compile(model) if compiled else None
        with compiled_counts() as counts:
            _train(model, sink, p, source, 6, torch.float64, autocast=False, forward=forward)
        rows[compiled] = sink.rows
        if compiled:
            breaks = counts.graph_breaks
            if source == "micro":
                assert breaks == {}, breaks
            else:
                assert sum(breaks.values()) <= 1, breaks  # one hooked Linear
    assert len(rows[True]) == 6
    for eager, compiled_row in zip(rows[False], rows[True], strict=True):
        for key in ("b_small", "b_big", "g_small_sq", "g_big_sq"):
            assert compiled_row[key] == pytest.approx(eager[key], rel=1e-9)


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))


def test_another_instance_compiled_without_hooks_does_not_hide_the_probes() -> None:
    """Dynamo skips guards on module hooks by default: code compiled for another instance of
    the class, without hooks, would be reused for the probed model and its hooks never run.
    The probe turns those guards on for compilations after it."""
    import torch._dynamo

    torch._dynamo.reset()
    x = torch.randn(4, 6)
    model, sink = _mlp(), ListSink()
    compiled = torch.compile(model)
    assert isinstance(compiled, nn.Module)  # an OptimizedModule; torch.compile is typed Callable
    probe = GradientNoiseProbe(compiled, sink, source="per_example")
    other = torch.compile(_mlp())
    other(x).sum().backward()  # same class, compiled first, without hooks
    for _ in range(2):
        compiled(x).sum().backward()
        probe.step(batch_size=4)
        model.zero_grad()
    assert len(sink.rows) == 2


def test_a_graph_compiled_before_the_probe_is_named_in_the_error() -> None:
    """The case the guards cannot reach (compiled without them, before the probe): the error
    says what happened and how to fix it, instead of logging nothing."""
    import torch._dynamo
    import torch._dynamo.config

    torch._dynamo.reset()
    torch._dynamo.config.skip_nnmodule_hook_guards = True  # the default, before any probe
    try:
        x = torch.randn(4, 6)
        other = torch.compile(_mlp())
        other(x).sum().backward()
        model = _mlp()
        compiled = torch.compile(model)
        assert isinstance(compiled, nn.Module)  # an OptimizedModule; torch.compile: a Callable
        probe = GradientNoiseProbe(compiled, ListSink(), source="per_example")
        compiled(x).sum().backward()
        with pytest.raises(RuntimeError, match="skip_nnmodule_hook_guards"):
            probe.step(batch_size=4)
    finally:
        torch._dynamo.config.skip_nnmodule_hook_guards = False
        torch._dynamo.reset()


class _Deep(nn.Module):
    """``n`` hooked Linear layers called in turn: more than dynamo's recompile limit (8)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(nn.Linear(6, 6) for _ in range(n))

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def _compilations(n_layers: int, steps: int) -> list[int]:
    """Frames dynamo compiled (recompilations included) after each of ``steps`` training steps
    of a compiled ``_Deep(n_layers)`` with the default probe (per-example at one backward)."""
    import torch._dynamo
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    model, sink, counter = _Deep(n_layers), ListSink(), CompileCounter()
    compiled = torch.compile(model, backend=counter)
    assert isinstance(compiled, nn.Module)  # an OptimizedModule; torch.compile: a Callable
    probe = GradientNoiseProbe(compiled, sink)
    g = torch.Generator().manual_seed(0)
    after = []
    try:
        for _ in range(steps):
            x, y = torch.randn(8, 6, generator=g), torch.randn(8, 6, generator=g)
            (compiled(x) - y).square().mean().backward()
            probe.step(batch_size=8)
            model.zero_grad()
            after.append(counter.frame_count)
    finally:
        torch._dynamo.reset()
    assert probe.source == "per_example" and probe.error is None
    assert len(sink.rows) == steps  # measured on every step
    return after


def test_compiled_model_compiles_a_bounded_number_of_times() -> None:
    """The per-example hooks never make dynamo trace the probe's per-step bookkeeping: it
    guarded on ``len(self._uses)`` (one more use per layer called) and compiled the one hook
    again for each hooked layer, up to its recompile limit. Now the compilations do not grow
    with the hooked layers, and none happens after the first step."""
    few, many = _compilations(3, 5), _compilations(12, 5)
    assert few[0] == few[-1] and many[0] == many[-1], (few, many)  # none after step 1
    assert many[-1] == few[-1], (few, many)  # not one per hooked layer
