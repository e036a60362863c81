"""A real 2-process gloo DDP run on the CPU: probe output vs a direct computation.

Per step, each rank's local gradient (before all-reduce) is G_small and the all-reduced
gradient is G_big; with gradient accumulation under ``no_sync`` each rank's micro-batch is a
G_small and the all-reduced accumulated gradient is G_big. The parent process regenerates the
same batches and computes the per-rank and all-reduced squared norms directly (numpy); the
probe's samples must match them to float32 precision, be identical on both ranks, and, over
longer runs (DDP only: 600 steps of 2 x 256; DDP + 2-step accumulation: 300 steps of
2 x 2 x 128),
give |G|^2, tr(Sigma), B_simple within 3% of the closed form. When one rank's probe fails
inside a gradient hook, both ranks stop measuring at that step and train on.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from noisescope.torch import GradientNoiseProbe, _rows
from tests.estimators.lsq_truth import LeastSquares
from tests.probes.gloo import WORLD, on_two_ranks
from tests.probes.lsq_torch import ListSink, lsq_model
from tests.probes.test_sources_truth import assert_truth

EXACT = {"d": 6, "steps": 5, "k": 2, "b": 8}
TRUTH_DDP = {"d": 32, "steps": 600, "k": 1, "b": 256}
TRUTH_COMBINED = {"d": 32, "steps": 300, "k": 2, "b": 128}
FAIL_STEP = 2  # rank 1's probe raises in this step's hooked backward


def _problem(d: int) -> tuple[LeastSquares, np.ndarray]:
    p = LeastSquares.make(d=d, sigma=0.5, seed=0)
    return p, p.w_star + 0.6 * np.random.default_rng(1).normal(size=p.d)


def _batches(p: LeastSquares, step: int, k: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    """The step's data for all ranks, shape (WORLD, k, b, d): same on every process."""
    return p.sample(np.random.default_rng(10_000 + step), (WORLD, k, b))


def _run_phase(rank: int, cfg: dict[str, int], readout: str = "auto") -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = _train(rank, cfg, readout=readout)["rows"]
    return rows


def _failing_norms(failing: list[bool]) -> Any:
    """The probe's norm factory, its norms raising while ``failing[0]``."""
    real = _rows._norm_into

    def factory(dtype: torch.dtype) -> _rows.NormInto:
        norm = real(dtype)

        def maybe_failing(grad: torch.Tensor, /, *, out: torch.Tensor) -> object:
            if failing[0]:
                raise RuntimeError("injected failure")
            return norm(grad, out=out)

        return maybe_failing

    return factory


def _train(
    rank: int, cfg: dict[str, int], fail: bool = False, lr: float = 0.0, readout: str = "auto"
) -> dict[str, Any]:
    p, w = _problem(cfg["d"])
    model = lsq_model(p, w)
    ddp = DDP(model)
    sink = ListSink()
    real = _rows._norm_into
    failing = [False]
    if fail:
        _rows._norm_into = _failing_norms(failing)
    try:
        probe = GradientNoiseProbe(ddp, sink, readout=readout)  # type: ignore[arg-type]
    finally:
        _rows._norm_into = real
    assert probe.source == "micro"
    assert probe.world_size == WORLD
    k, b = cfg["k"], cfg["b"]
    for step in range(cfg["steps"]):
        failing[0] = fail and rank == 1 and step >= FAIL_STEP  # in hooked backwards only
        x, y = (torch.from_numpy(a[rank]) for a in _batches(p, step, k, b))
        for j in range(k):
            loss = 0.5 * (ddp(x[j]).squeeze(-1) - y[j]).square().mean() / k
            if j < k - 1:
                with ddp.no_sync():
                    loss.backward()
            else:
                loss.backward()
            probe.micro_step(batch_size=b)
        probe.step()
        with torch.no_grad():  # plain SGD (lr 0: the direct norms assume a fixed w)
            assert model.weight.grad is not None
            model.weight -= lr * model.weight.grad
        ddp.zero_grad()
    probe.remove()
    return {"rows": sink.rows, "error": probe.error, "weight": model.weight.flatten().tolist()}


def _work(rank: int) -> dict[str, Any]:
    return {
        "exact_ddp": _run_phase(rank, {**EXACT, "k": 1}),
        "exact_combined": _run_phase(rank, EXACT),
        "truth_ddp": _run_phase(rank, TRUTH_DDP),
        "truth_combined": _run_phase(rank, TRUTH_COMBINED),
        "exact_combined_deferred": _run_phase(rank, EXACT, readout="deferred"),
        "failure": _train(rank, EXACT, fail=True, lr=0.01),
        "failure_deferred": _train(rank, EXACT, fail=True, lr=0.01, readout="deferred"),
        "no_failure": _train(rank, EXACT, lr=0.01),
    }


def _warm_ddp_imports() -> None:
    """Import what DDP's constructor imports lazily, once, in the parent."""
    import torch._dynamo  # noqa: F401


@pytest.fixture(scope="module")
def ddp_rows(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    _warm_ddp_imports()
    return on_two_ranks(_work, tmp_path_factory.mktemp("ddp"))


def _direct(cfg: dict[str, int], w: np.ndarray | None = None) -> list[tuple[float, float]]:
    """Per step: mean over ranks and micro-batches of |local micro gradient|^2, |all-reduced|^2
    (at ``w``, default the problem's)."""
    p, w0 = _problem(cfg["d"])
    w = w0 if w is None else w
    out = []
    for step in range(cfg["steps"]):
        x, y = _batches(p, step, cfg["k"], cfg["b"])
        micro = p.per_example_grads(w, x, y).mean(2)  # (WORLD, k, d)
        g_small_sq = float((micro**2).sum(-1).mean())
        g_big_sq = float((micro.mean((0, 1)) ** 2).sum())
        out.append((g_small_sq, g_big_sq))
    return out


@pytest.mark.parametrize(("phase", "k"), [("exact_ddp", 1), ("exact_combined", EXACT["k"])])
def test_probe_matches_direct_per_rank_and_allreduced_norms(
    ddp_rows: list[dict[str, Any]], phase: str, k: int
) -> None:
    rows = [r[phase] for r in ddp_rows]
    assert rows[0] == rows[1]  # every rank logs the same, rank-averaged sample
    direct = _direct({**EXACT, "k": k})
    assert len(rows[0]) == EXACT["steps"]
    for row, (g_small_sq, g_big_sq) in zip(rows[0], direct, strict=True):
        assert row["b_small"] == EXACT["b"]
        assert row["b_big"] == WORLD * k * EXACT["b"]
        assert row["g_small_sq"] == pytest.approx(g_small_sq, rel=1e-5)
        assert row["g_big_sq"] == pytest.approx(g_big_sq, rel=1e-5)
    assert rows[0][-1]["examples"] == EXACT["steps"] * WORLD * k * EXACT["b"]


@pytest.mark.parametrize(
    ("phase", "cfg"), [("truth_ddp", TRUTH_DDP), ("truth_combined", TRUTH_COMBINED)]
)
def test_ddp_sources_match_closed_form(
    ddp_rows: list[dict[str, Any]], phase: str, cfg: dict[str, int]
) -> None:
    p, w = _problem(cfg["d"])
    rows = ddp_rows[0][phase]
    assert rows[0]["b_big"] == WORLD * cfg["k"] * cfg["b"]
    assert_truth(rows, p.truth(w))


def test_a_failure_on_one_rank_stops_every_rank_at_the_same_step(
    ddp_rows: list[dict[str, Any]],
) -> None:
    """Rank 1's probe raises in a gradient hook: it must still meet the other rank in the
    probe's all-reduce (else that rank waits forever), and both stop measuring there."""
    failed = [r["failure"] for r in ddp_rows]
    assert failed[1]["error"] == "RuntimeError: injected failure"
    assert "other rank" in failed[0]["error"]
    for rank in failed:
        assert [row["step"] for row in rank["rows"]] == list(range(FAIL_STEP))
    clean = [r["no_failure"] for r in ddp_rows]
    assert failed[0]["rows"] == clean[0]["rows"][:FAIL_STEP]
    # training went on as without the failure, on both ranks
    assert failed[0]["weight"] == failed[1]["weight"] == clean[0]["weight"]


def test_deferred_readout_logs_the_same_samples_and_stops_at_the_same_step(
    ddp_rows: list[dict[str, Any]],
) -> None:
    """Deferred readout (the accelerators' default): the all-reduce is launched in step() and
    read at the next measured step, the last one at remove(). Same samples; after rank 1's
    failure both ranks stop at the same step, as with the immediate readout."""
    for rank in ddp_rows:
        assert rank["exact_combined_deferred"] == rank["exact_combined"]
        deferred, immediate = rank["failure_deferred"], rank["failure"]
        assert deferred["rows"] == immediate["rows"]
        assert deferred["error"] == immediate["error"]
        assert deferred["weight"] == immediate["weight"]
