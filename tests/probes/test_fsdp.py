"""FSDP2 (``fully_shard``) on 2 real gloo processes on the CPU: probe vs a direct computation.

The weight is sharded along its input dimension (each rank holds half of it), so |G_big|^2 is
only right if the shards' squared norms are summed over the ranks. Micro-batch source: each
rank's local gradient (before the reduce-scatter) is G_small, the reduced one G_big, with one
backward per step and with 2 micro-batches, the first under
``set_requires_gradient_sync(False)`` (where FSDP never touches the sharded parameters' hooks).
Per-example source: each rank's examples, B_big all ranks' examples. The parent regenerates
the batches and computes the norms directly (numpy); the samples must match to float precision
and be identical on both ranks, and longer runs (fixed seeds; steps x ranks x micro-batches x
examples stated in ``TRUTH``) give |G|^2, tr(Sigma), B_simple within 3% of the closed form.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard

from noisescope.torch import GradientNoiseProbe
from tests.probes.gloo import WORLD, on_two_ranks
from tests.probes.lsq_torch import ListSink, finished, lsq_model
from tests.probes.test_ddp import _batches, _direct, _problem
from tests.probes.test_sources_truth import assert_truth

EXACT = {"d": 6, "steps": 4, "b": 8}
#: (source, k, steps, b): examples per step = WORLD x k x b
TRUTH = {
    "micro": ("micro", 1, 600, 256),
    "micro_accumulated": ("micro", 2, 300, 128),
    "per_example": ("per_example", 1, 200, 128),
}
PHASES = [("micro", 1), ("micro", 2), ("per_example", 1), ("per_example", 2)]
#: the same with a GradScaler's scaled loss (fp16 AMP's loss scale): divided out
SCALED = [("micro", 2), ("per_example", 1)]
#: the same with the sharded model compiled (inductor)
COMPILED = [("micro", 2), ("per_example", 1)]


#: How a ``_train`` run differs from the plain one: a scaled loss, the deferred readout, or
#: the probe made inside the first forward.
Variant = Literal["plain", "scaled", "deferred", "made_in_forward"]


def _train(
    rank: int,
    source: str,
    k: int,
    variant: Variant = "plain",
    *,
    d: int = EXACT["d"],
    steps: int = EXACT["steps"],
    b: int = EXACT["b"],
) -> dict[str, Any]:
    p, w = _problem(d)
    made_in_forward = variant == "made_in_forward"
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0, enabled=variant == "scaled")
    model = lsq_model(p, w)
    # shard the weight's input dimension: both ranks hold half of it
    fully_shard(model, shard_placement_fn=lambda _param: Shard(1))
    sink = ListSink()

    def make_probe(*_: Any) -> GradientNoiseProbe:
        return GradientNoiseProbe(
            model,
            sink,
            source="auto" if source == "micro" else source,  # type: ignore[arg-type]
            scaler=scaler,
            readout="deferred" if variant == "deferred" else "auto",
        )

    probes: list[GradientNoiseProbe] = []
    if made_in_forward:  # as the Hugging Face callback does: before FSDP's own pre-hook
        first = model.register_forward_pre_hook(
            lambda *_: probes.append(make_probe()), prepend=True
        )
    else:
        probes.append(make_probe())
    for step in range(steps):
        x, y = (torch.from_numpy(a[rank]) for a in _batches(p, step, k, b))
        for j in range(k):
            model.set_requires_gradient_sync(j == k - 1)  # type: ignore[operator]
            loss = 0.5 * (model(x[j]).squeeze(-1) - y[j]).square().mean() / k
            scaler.scale(loss).backward()
            if made_in_forward and step == j == 0:
                first.remove()
            probes[0].micro_step(batch_size=b)
        probes[0].step()
        model.zero_grad()
    return finished(probes[0], sink)


def _mlp_steps(rank: int, source: str, k: int, compiled: bool, probe: bool) -> dict[str, Any]:
    """A sharded 2-layer MLP, eager or with its forward compiled (inductor) after
    ``fully_shard``; with or without the probe: its rows, dynamo's graph breaks and the graphs
    it compiled. ``torch.compile(model)`` of a sharded root compiles nothing in torch 2.13:
    FSDP2's hooks are excluded from tracing and the whole call falls back to eager (one graph
    break, no graph), so the forward method is compiled, FSDP's hooks staying outside."""
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1)).double()
    fully_shard(model)
    if compiled:
        model.forward = torch.compile(model.forward)  # type: ignore[method-assign]
    sink = ListSink()
    made = GradientNoiseProbe(model, sink, source=source) if probe else None  # type: ignore[arg-type]
    p, _ = _problem(6)
    for step in range(EXACT["steps"]):
        x, y = (torch.from_numpy(a[rank]) for a in _batches(p, step, k, EXACT["b"]))
        for j in range(k):
            model.set_requires_gradient_sync(j == k - 1)  # type: ignore[operator]
            loss = 0.5 * (model(x[j]).squeeze(-1) - y[j]).square().mean() / k
            loss.backward()
            if made is not None:
                made.micro_step(batch_size=EXACT["b"])
        if made is not None:
            made.step()
        model.zero_grad()
    result = finished(made, sink) if made is not None else {}
    result["graph_breaks"] = sum(counters["graph_break"].values())
    result["graphs"] = counters["stats"]["unique_graphs"]
    return result


def _work(rank: int) -> dict[str, Any]:
    result = {f"exact_{source}_{k}": _train(rank, source, k) for source, k in PHASES}
    for source, k in SCALED:
        result[f"exact_{source}_{k}_scaled"] = _train(rank, source, k, "scaled")
    for source, k in SCALED:  # deferred readout: the same samples
        result[f"exact_{source}_{k}_deferred"] = _train(rank, source, k, "deferred")
    # the probe made inside the first forward, whose module owns the weight
    result["exact_micro_2_made_in_forward"] = _train(rank, "micro", 2, "made_in_forward")
    for source, k in COMPILED:
        variants = [(False, True), (True, True)] + ([(True, False)] if source == "micro" else [])
        for compiled, probe in variants:
            name = f"mlp_{source}_{k}_{'compiled' if compiled else 'eager'}"
            result[name + ("" if probe else "_unprobed")] = _mlp_steps(
                rank, source, k, compiled, probe
            )
    for name, (source, k, steps, b) in TRUTH.items():
        result[f"truth_{name}"] = _train(rank, source, k, d=32, steps=steps, b=b)
    return result


@pytest.fixture(scope="module")
def fsdp_runs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    import torch._dynamo  # noqa: F401  (imported lazily by FSDP: once, before the fork)

    return on_two_ranks(_work, tmp_path_factory.mktemp("fsdp"))


def _direct_per_example(
    d: int, steps: int, k: int, b: int, w: np.ndarray | None = None
) -> list[tuple[float, float]]:
    """Per step: mean over all ranks' examples of |per-example gradient|^2, |reduced|^2 (at
    ``w``, default the problem's)."""
    p, w0 = _problem(d)
    w = w0 if w is None else w
    out = []
    for step in range(steps):
        x, y = _batches(p, step, k, b)
        per_example = p.per_example_grads(w, x, y)  # (WORLD, k, b, d)
        g_small_sq = float((per_example**2).sum(-1).mean())
        g_big_sq = float((per_example.mean((0, 1, 2)) ** 2).sum())
        out.append((g_small_sq, g_big_sq))
    return out


@pytest.mark.parametrize(
    ("source", "k", "scaled"), [(*p, False) for p in PHASES] + [(*p, True) for p in SCALED]
)
def test_fsdp2_matches_direct_local_and_reduced_norms(
    fsdp_runs: list[dict[str, Any]], source: str, k: int, scaled: bool
) -> None:
    runs = [r[f"exact_{source}_{k}" + ("_scaled" if scaled else "")] for r in fsdp_runs]
    assert runs[0]["kind"] == "fsdp2" and runs[0]["world"] == WORLD  # detected, no wiring
    assert runs[0]["source"] == source and runs[0]["error"] is None
    assert runs[0]["rows"] == runs[1]["rows"]  # every rank logs the same sample
    if source == "micro":
        direct = _direct({**EXACT, "k": k})
        b_small = EXACT["b"]
    else:
        direct = _direct_per_example(EXACT["d"], EXACT["steps"], k, EXACT["b"])
        b_small = 1
    rows = runs[0]["rows"]
    assert len(rows) == EXACT["steps"]
    for row, (g_small_sq, g_big_sq) in zip(rows, direct, strict=True):
        assert row["b_small"] == b_small
        assert row["b_big"] == pytest.approx(WORLD * k * EXACT["b"])
        assert row["g_small_sq"] == pytest.approx(g_small_sq, rel=1e-6)
        assert row["g_big_sq"] == pytest.approx(g_big_sq, rel=1e-6)
    assert rows[-1]["examples"] == EXACT["steps"] * WORLD * k * EXACT["b"]


def test_fsdp2_probe_made_inside_the_first_forward_logs_the_same_samples(
    fsdp_runs: list[dict[str, Any]],
) -> None:
    """A probe made in a forward pre-hook, before FSDP unshards (the Hugging Face callback
    makes it at the first training forward): it still hooks the unsharded weight of the
    module whose forward is running."""
    for rank in fsdp_runs:
        assert rank["exact_micro_2_made_in_forward"]["rows"] == rank["exact_micro_2"]["rows"]


@pytest.mark.parametrize(("source", "k"), COMPILED)
def test_fsdp2_compiled_logs_the_eager_samples(
    fsdp_runs: list[dict[str, Any]], source: str, k: int
) -> None:
    """The sharded MLP's forward compiled (inductor): the eager samples. The micro source adds
    no graph break (its hooks sit on the unsharded parameters and on the module call, which
    runs eagerly). Per-example hooks sit inside the forward: at most one break per Linear."""
    for rank in fsdp_runs:
        eager, compiled = rank[f"mlp_{source}_{k}_eager"], rank[f"mlp_{source}_{k}_compiled"]
        assert compiled["kind"] == "fsdp2" and compiled["error"] is None
        assert len(compiled["rows"]) == EXACT["steps"]
        for row, eager_row in zip(compiled["rows"], eager["rows"], strict=True):
            for key in ("b_small", "b_big", "g_small_sq", "g_big_sq"):
                assert row[key] == pytest.approx(eager_row[key], rel=1e-9)
        assert compiled["graphs"] >= 1  # the MLP's body was compiled
        if source == "micro":
            unprobed = rank[f"mlp_{source}_{k}_compiled_unprobed"]
            assert compiled["graph_breaks"] == unprobed["graph_breaks"] == 0
        else:
            assert compiled["graph_breaks"] <= 2


@pytest.mark.parametrize("name", list(TRUTH))
def test_fsdp2_sources_match_closed_form(fsdp_runs: list[dict[str, Any]], name: str) -> None:
    p, w = _problem(32)
    rows = fsdp_runs[0][f"truth_{name}"]["rows"]
    _, k, steps, b = TRUTH[name]
    assert len(rows) == steps
    assert rows[0]["b_big"] == pytest.approx(WORLD * k * b)
    assert_truth(rows, p.truth(w))


@pytest.mark.parametrize(("source", "k"), SCALED)
def test_fsdp2_deferred_readout_logs_the_same_samples(
    fsdp_runs: list[dict[str, Any]], source: str, k: int
) -> None:
    for rank in fsdp_runs:
        assert rank[f"exact_{source}_{k}_deferred"]["rows"] == rank[f"exact_{source}_{k}"]["rows"]
