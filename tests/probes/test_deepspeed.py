"""DeepSpeed ZeRO stages 1 and 2 on 2 real gloo processes on the CPU: probe vs a direct
computation and vs the closed form.

``deepspeed.initialize`` with its CPU accelerator, ``engine.backward`` / ``engine.step`` on
every micro-batch (``gradient_accumulation_steps`` 1 and 2), the probe made from the engine
alone. Micro source: each rank's local micro-batch gradient is G_small (read by tensor hooks,
before DeepSpeed's reduction hooks), the engine's own norm of the averaged gradient G_big;
per-example source: each rank's examples. The parent regenerates the batches and computes the
norms directly (numpy; the model in fp64, the engine's fp32 master copy and fp32 norm: rel
1e-5); fp16 checks the loss scale (static 256) is divided out of G_small only. Longer runs
(fixed seeds; steps x ranks x micro-batches x examples stated in ``TRUTH``) give |G|^2,
tr(Sigma), B_simple within 3% of the closed form, at the rounded weights for bf16. Stage 3 and
stage 0 engines are refused naming what is supported.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
import torch

from noisescope.torch import GradientNoiseProbe
from tests.probes.gloo import WORLD, on_two_ranks
from tests.probes.lsq_torch import ListSink, finished, lsq_model
from tests.probes.test_ddp import _batches, _direct, _problem
from tests.probes.test_fsdp import _direct_per_example
from tests.probes.test_sources_truth import assert_truth

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # read when DeepSpeed first picks a device
deepspeed = pytest.importorskip("deepspeed")

#: DeepSpeed's CPU accelerator takes fp16 only where oneDNN computes in it (AVX512-FP16 or
#: AMX-FP16); elsewhere ``deepspeed.initialize`` refuses an fp16 config.
FP16 = bool(deepspeed.get_accelerator().is_fp16_supported())

EXACT = {"d": 6, "steps": 4, "b": 8}
#: (stage, source, k, precision, variant): one engine each, on EXACT's data. "clipped":
#: gradient_clipping far below the norm (the norm read is the one before clipping);
#: "deferred": the deferred readout (the same samples as the immediate one)
PHASES = [
    (1, "micro", 1, "fp64", ""),
    (1, "micro", 2, "fp64", ""),
    (2, "micro", 1, "fp64", ""),
    (2, "micro", 2, "fp64", ""),
    (2, "per_example", 2, "fp64", ""),
    (1, "micro", 2, "fp64", "clipped"),
    (2, "micro", 2, "fp64", "clipped"),
    (2, "micro", 2, "fp64", "deferred"),
]
FP16_PHASE = (2, "micro", 2, "fp16", "")
#: what the ranks train: the fp16 engine only where this CPU has fp16
TRAINED = [*PHASES, FP16_PHASE] if FP16 else PHASES
#: name -> (stage, source, k, steps, b, precision): examples per step = WORLD x k x b
TRUTH = {
    "zero1": (1, "micro", 1, 600, 256, "fp32"),
    "zero1_accumulated": (1, "micro", 2, 300, 128, "fp32"),
    "zero2_accumulated": (2, "micro", 2, 300, 128, "fp32"),
    "zero2_per_example": (2, "per_example", 1, 200, 128, "fp32"),
    "zero2_bf16_accumulated": (2, "micro", 2, 300, 128, "bf16"),
}
DTYPES = {
    "fp64": torch.float64,
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}


def _config(stage: int, k: int, b: int, precision: str, clipped: bool) -> dict[str, Any]:
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": b,
        "gradient_accumulation_steps": k,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,  # torch's SGD
        "steps_per_print": 10**9,
    }
    if precision == "bf16":
        config["bf16"] = {"enabled": True}
    if precision == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 256.0}
    if clipped:
        config["gradient_clipping"] = 1e-3
    return config


def _engine(
    d: int, stage: int, k: int, b: int, precision: str, clipped: bool = False
) -> tuple[Any, np.ndarray]:
    """A ZeRO engine around the least-squares model at w (lr 0: w stays, the truth is exact);
    returns it with the weights it holds (rounded in bf16/fp16)."""
    p, w = _problem(d)
    model = lsq_model(p, w).to(DTYPES[precision])
    sgd = torch.optim.SGD(model.parameters(), lr=0.0)
    engine, *_ = deepspeed.initialize(
        model=model, optimizer=sgd, config=_config(stage, k, b, precision, clipped)
    )
    return engine, engine.module.weight.detach().double().flatten().numpy()


def _train(
    rank: int,
    stage: int,
    source: str,
    d: int,
    k: int,
    steps: int,
    b: int,
    precision: str,
    variant: str = "",
) -> dict[str, Any]:
    p, _ = _problem(d)
    engine, w = _engine(d, stage, k, b, precision, clipped=variant == "clipped")
    dtype = DTYPES[precision]
    sink = ListSink()
    readout = "deferred" if variant == "deferred" else "auto"
    probe = GradientNoiseProbe(engine, sink, source=source, readout=readout)  # type: ignore[arg-type]
    for step in range(steps):
        x, y = (torch.from_numpy(a[rank]).to(dtype) for a in _batches(p, step, k, b))
        for j in range(k):
            loss = 0.5 * (engine(x[j]).squeeze(-1).float() - y[j].float()).square().mean()
            engine.backward(loss)
            probe.micro_step(batch_size=b)
            engine.step()
            probe.step()
    return {**finished(probe, sink), "w": w.tolist()}


def _misuse(rank: int) -> dict[str, str]:
    """What the probe says to each misuse under DeepSpeed (ValueError at once; probe.step()
    before engine.step(): RuntimeError at the next step's first micro_step)."""
    p, _ = _problem(EXACT["d"])
    engine, _ = _engine(EXACT["d"], 2, 2, EXACT["b"], "fp64")
    said: dict[str, str] = {}
    for name, kwargs in (("layers", {"layers": True}), ("scaler", {"scaler": object()})):
        try:
            GradientNoiseProbe(engine, ListSink(), **kwargs)
        except ValueError as exc:
            said[name] = str(exc)
    probe = GradientNoiseProbe(engine, ListSink())
    try:
        probe.step(batch_size=EXACT["b"])
    except ValueError as exc:
        said["batch_size"] = str(exc)
    try:
        for step in range(2):
            x, y = (torch.from_numpy(a[rank]) for a in _batches(p, step, 2, EXACT["b"]))
            for j in range(2):
                engine.backward(0.5 * (engine(x[j]).squeeze(-1) - y[j]).square().mean())
                probe.micro_step(batch_size=EXACT["b"])
                probe.step()  # too early: before engine.step()
                engine.step()
    except RuntimeError as exc:
        said["order"] = f"{exc} (step {step}, micro-batch {j})"
    probe.remove()
    return said


def _refused(stage: int) -> str:
    engine, _ = _engine(EXACT["d"], stage, 1, EXACT["b"], "fp32")
    try:
        GradientNoiseProbe(engine, ListSink())
    except TypeError as exc:
        return str(exc)
    return "not refused"


def _work(rank: int) -> dict[str, Any]:
    result: dict[str, Any] = {
        f"exact_{stage}_{source}_{k}_{precision}_{variant}": _train(
            rank, stage, source, EXACT["d"], k, EXACT["steps"], EXACT["b"], precision, variant
        )
        for stage, source, k, precision, variant in TRAINED
    }
    for name, (stage, source, k, steps, b, precision) in TRUTH.items():
        result[f"truth_{name}"] = _train(rank, stage, source, 32, k, steps, b, precision)
    result["refused"] = {str(stage): _refused(stage) for stage in (0, 3)}
    result["misuse"] = _misuse(rank)
    return result


@pytest.fixture(scope="module")
def ds_runs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    # DeepSpeed's CPU backend JIT-compiles its shared-memory allreduce (a C++ build of minutes
    # on a busy 2-core machine) under a lock file in ~/.cache/torch_extensions; a build killed
    # part-way (a test timeout) leaves the lock, and every later run on the machine waits on it
    # forever. Its engines reduce through torch.distributed (gloo) without it, as the probe
    # does; the ranks inherit the edit (DeepSpeed keeps this dict for edits to persist).
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    return on_two_ranks(_work, tmp_path_factory.mktemp("deepspeed"))


@pytest.mark.parametrize(
    ("stage", "source", "k", "precision", "variant"),
    [
        *PHASES,
        pytest.param(
            *FP16_PHASE,
            marks=pytest.mark.skipif(not FP16, reason="this CPU has no fp16 for DeepSpeed"),
        ),
    ],
)
def test_zero_matches_direct_local_and_reduced_norms(
    ds_runs: list[dict[str, Any]], stage: int, source: str, k: int, precision: str, variant: str
) -> None:
    runs = [r[f"exact_{stage}_{source}_{k}_{precision}_{variant}"] for r in ds_runs]
    assert runs[0]["kind"] == "deepspeed" and runs[0]["world"] == WORLD  # detected, no wiring
    assert runs[0]["source"] == source and runs[0]["error"] is None
    assert runs[0]["rows"] == runs[1]["rows"]  # every rank logs the same sample
    w = np.array(runs[0]["w"])
    if source == "micro":
        direct = _direct({**EXACT, "k": k}, w)
        b_small = EXACT["b"]
    else:
        direct = _direct_per_example(EXACT["d"], EXACT["steps"], k, EXACT["b"], w)
        b_small = 1
    rows = runs[0]["rows"]
    assert len(rows) == EXACT["steps"]
    rel = 1e-5 if precision == "fp64" else 2e-2  # fp16: the gradients' own rounding
    for row, (g_small_sq, g_big_sq) in zip(rows, direct, strict=True):
        assert row["b_small"] == b_small
        assert row["b_big"] == pytest.approx(WORLD * k * EXACT["b"])
        assert row["g_small_sq"] == pytest.approx(g_small_sq, rel=rel)
        assert row["g_big_sq"] == pytest.approx(g_big_sq, rel=rel)
    assert rows[-1]["examples"] == EXACT["steps"] * WORLD * k * EXACT["b"]


def test_deferred_readout_logs_the_same_samples(ds_runs: list[dict[str, Any]]) -> None:
    for rank in ds_runs:
        deferred = rank["exact_2_micro_2_fp64_deferred"]
        assert deferred["rows"] == rank["exact_2_micro_2_fp64_"]["rows"]


@pytest.mark.parametrize("name", list(TRUTH))
def test_zero_sources_match_closed_form(ds_runs: list[dict[str, Any]], name: str) -> None:
    p, _ = _problem(32)
    run = ds_runs[0][f"truth_{name}"]
    _, _, k, steps, b, _ = TRUTH[name]
    assert run["error"] is None and len(run["rows"]) == steps
    assert run["rows"][0]["b_big"] == pytest.approx(WORLD * k * b)
    assert_truth(run["rows"], p.truth(np.array(run["w"])))


@pytest.mark.parametrize("stage", ["0", "3"])
def test_zero_stages_other_than_1_and_2_are_refused(
    ds_runs: list[dict[str, Any]], stage: str
) -> None:
    message = ds_runs[0]["refused"][stage]
    assert f"ZeRO stage {stage}" in message
    assert "Supported: DeepSpeed ZeRO stages 1 and 2" in message


def test_misuse_under_deepspeed_is_told(ds_runs: list[dict[str, Any]]) -> None:
    for rank in ds_runs:
        said = rank["misuse"]
        assert "layers= is not supported under DeepSpeed" in said["layers"]
        assert "scaler= is not used under DeepSpeed" in said["scaler"]
        assert "pass batch_size to probe.micro_step()" in said["batch_size"]
        # the engine stepped at step 0's last micro-batch: told at step 1's first micro_step
        assert said["order"].startswith("noisescope: under DeepSpeed call probe.step() after")
        assert said["order"].endswith("(step 1, micro-batch 0)")
