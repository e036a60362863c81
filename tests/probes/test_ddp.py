"""A real 2-process gloo DDP run on the CPU: probe output vs a direct computation.

Per step, each rank's local gradient (before all-reduce) is G_small and the all-reduced
gradient is G_big; with gradient accumulation under ``no_sync`` each rank's micro-batch is a
G_small and the all-reduced accumulated gradient is G_big. The parent process regenerates the
same batches and computes the per-rank and all-reduced squared norms directly (numpy); the
probe's samples must match them to float32 precision, be identical on both ranks, and, over
longer runs (DDP only: 600 steps of 2 x 256; DDP + 2-step accumulation: 300 steps of
2 x 2 x 128),
give |G|^2, tr(Sigma), B_simple within 3% of the closed form.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

from noisescope.torch import GradientNoiseProbe
from tests.estimators.lsq_truth import LeastSquares
from tests.probes.lsq_torch import ListSink, lsq_model
from tests.probes.test_sources_truth import assert_truth
from tests.support.servers import free_port

WORLD = 2
EXACT = {"d": 6, "steps": 5, "k": 2, "b": 8}
TRUTH_DDP = {"d": 32, "steps": 600, "k": 1, "b": 256}
TRUTH_COMBINED = {"d": 32, "steps": 300, "k": 2, "b": 128}


def _problem(d: int) -> tuple[LeastSquares, np.ndarray]:
    p = LeastSquares.make(d=d, sigma=0.5, seed=0)
    return p, p.w_star + 0.6 * np.random.default_rng(1).normal(size=p.d)


def _batches(p: LeastSquares, step: int, k: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    """The step's data for all ranks, shape (WORLD, k, b, d): same on every process."""
    return p.sample(np.random.default_rng(10_000 + step), (WORLD, k, b))


def _run_phase(rank: int, cfg: dict[str, int]) -> list[dict[str, Any]]:
    p, w = _problem(cfg["d"])
    model = lsq_model(p, w)
    ddp = DDP(model)
    sink = ListSink()
    probe = GradientNoiseProbe(ddp, sink)  # auto: DDP -> micro-batch source
    assert probe.source == "micro"
    assert probe.world_size == WORLD
    k, b = cfg["k"], cfg["b"]
    for step in range(cfg["steps"]):
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
        ddp.zero_grad()
    probe.remove()
    return sink.rows


def _worker(rank: int, port: int, out_dir: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # no hostname lookup (slow offline)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        result = {
            "exact_ddp": _run_phase(rank, {**EXACT, "k": 1}),
            "exact_combined": _run_phase(rank, EXACT),
            "truth_ddp": _run_phase(rank, TRUTH_DDP),
            "truth_combined": _run_phase(rank, TRUTH_COMBINED),
        }
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def _warm_ddp_imports() -> None:
    """Import what DDP's constructor imports lazily, once, in the parent."""
    import torch._dynamo  # noqa: F401


@pytest.fixture(scope="module")
def ddp_rows(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("ddp")
    # fork: the children inherit the parent's imports (DDP's first use imports torch._dynamo,
    # many seconds per process on a busy 2-core machine). Nothing here has started threads
    # that a fork could break: no DataLoader workers, no CUDA.
    _warm_ddp_imports()
    mp.start_processes(
        _worker, args=(free_port(), str(out)), nprocs=WORLD, join=True, start_method="fork"
    )
    return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(WORLD)]


def _direct(cfg: dict[str, int]) -> list[tuple[float, float]]:
    """Per step: mean over ranks and micro-batches of |local micro gradient|^2, |all-reduced|^2."""
    p, w = _problem(cfg["d"])
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
