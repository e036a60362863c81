"""Deterministic sample batches for server tests."""

from __future__ import annotations

import random
from typing import Any

from noisescope.estimators import two_batch_estimates


def columns(
    n: int,
    *,
    start: int = 0,
    seed: int = 0,
    b_small: float = 8.0,
    b_big: float = 32.0,
    series: str = "",
    loss0: float = 2.0,
) -> dict[str, list[Any]]:
    """``n`` samples with seq/step ``start..start+n-1`` and a B_simple near 40.

    Squared norms follow E|G_B|^2 = |G|^2 + tr(Sigma)/B (docs/science.md eq. 1) with |G|^2 = 1,
    tr(Sigma) = 40, plus noise.
    """
    rng = random.Random(seed * 1_000_003 + start)
    seq = list(range(start, start + n))
    g_small = [1.0 + 40.0 / b_small + rng.gauss(0, 0.5) ** 2 for _ in seq]
    g_big = [1.0 + 40.0 / b_big + rng.gauss(0, 0.2) ** 2 for _ in seq]
    return {
        "seq": seq,
        "step": list(seq),
        "examples": [float(s * b_big) for s in seq],
        "b_small": [b_small] * n,
        "b_big": [b_big] * n,
        "g_small_sq": g_small,
        "g_big_sq": g_big,
        "loss": [loss0 / (1.0 + 0.01 * s) for s in seq],
        "lr": [0.1] * n,
        "time": [1_700_000_000.0 + s for s in seq],
        "series": [series] * n,
    }


def log_sample_args(cols: dict[str, list[Any]], i: int) -> tuple[Any, Any, Any, Any, Any]:
    """Sample ``i`` of ``columns(...)`` as ``Run.log_sample``'s positional arguments: step,
    b_small, b_big, g_small_sq, g_big_sq (a test logging through the client)."""
    return (
        cols["step"][i],
        cols["b_small"][i],
        cols["b_big"][i],
        cols["g_small_sq"][i],
        cols["g_big_sq"][i],
    )


def expected_sums(cols: dict[str, list[Any]]) -> tuple[float, float]:
    """sum |𝒢|^2 and sum 𝒮 over the samples, straight from the estimator module."""
    g_total = s_total = 0.0
    for bs, bb, gs, gb in zip(
        cols["b_small"], cols["b_big"], cols["g_small_sq"], cols["g_big_sq"], strict=True
    ):
        g, s = two_batch_estimates(bs, bb, gs, gb)
        g_total += g
        s_total += s
    return g_total, s_total


def run_body(project: str = "proj", task: str = "task", **extra: Any) -> dict[str, Any]:
    return {"project": project, "task": task, "name": "r", "batch_size": 32, **extra}
