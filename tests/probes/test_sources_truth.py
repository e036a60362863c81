"""Each probe source against the closed-form least-squares truth (docs/science.md, "Ground truth").

The model is fixed at w (no optimizer step), so the truth at w is exact; every step draws fresh
batches. Each source's |G|^2, tr(Sigma) and B_simple, from the sums of its logged samples, must
be within 3% of the closed form at the stated number of steps (fixed seeds).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from noisescope.estimators import NoiseScale, two_batch_estimates
from noisescope.torch import GradientNoiseProbe
from tests.estimators.lsq_truth import LeastSquares
from tests.probes.lsq_torch import ListSink, lsq_model

TOL = 0.03


@pytest.fixture(scope="module")
def problem() -> tuple[LeastSquares, np.ndarray, dict[str, float]]:
    p = LeastSquares.make(d=32, sigma=0.5, seed=0)
    w = p.w_star + 0.6 * np.random.default_rng(1).normal(size=p.d)
    return p, w, p.truth(w)


def window(rows: list[dict[str, float]]) -> NoiseScale:
    est = [
        two_batch_estimates(r["b_small"], r["b_big"], r["g_small_sq"], r["g_big_sq"]) for r in rows
    ]
    return NoiseScale.from_sums(sum(e[0] for e in est), sum(e[1] for e in est), len(est))


def assert_truth(rows: list[dict[str, float]], truth: dict[str, float]) -> None:
    ns = window(rows)
    assert ns.b_simple is not None, ns.reason
    for name, value in (
        ("g_sq", ns.g_sq),
        ("trace_sigma", ns.trace_sigma),
        ("b_simple", ns.b_simple),
    ):
        print(f"{name}: {value / truth[name] - 1:+.4f}")
        assert abs(value / truth[name] - 1) <= TOL, (name, value, truth[name])


def test_accumulation_mean_over_k(
    problem: tuple[LeastSquares, np.ndarray, dict[str, float]],
) -> None:
    """4 micro-batches of 32, loss = mean / k (PyTorch/nanoGPT); 400 steps."""
    p, w, truth = problem
    steps, k, b = 400, 4, 32
    model, sink = lsq_model(p, w), ListSink()
    probe = GradientNoiseProbe(model, sink, source="micro")
    x, y = (torch.from_numpy(a) for a in p.sample(np.random.default_rng(2), (steps, k, b)))
    for i in range(steps):
        for j in range(k):
            loss = 0.5 * (model(x[i, j]).squeeze(-1) - y[i, j]).square().mean()
            (loss / k).backward()
            probe.micro_step(batch_size=b)
        probe.step(loss=loss.item(), lr=0.1)
        model.zero_grad()
    rows = sink.series("")
    assert len(rows) == steps
    assert rows[0]["b_small"] == b and rows[0]["b_big"] == k * b
    assert rows[-1]["examples"] == steps * k * b
    assert rows[0]["lr"] == 0.1
    assert_truth(rows, truth)


def test_per_example(problem: tuple[LeastSquares, np.ndarray, dict[str, float]]) -> None:
    """B_small = 1 by the Linear identity, batches of 128, mean-reduced loss; 400 steps."""
    p, w, truth = problem
    steps, b = 400, 128
    model, sink = lsq_model(p, w), ListSink()
    probe = GradientNoiseProbe(model, sink)  # auto: one process, one backward -> per-example
    x, y = (torch.from_numpy(a) for a in p.sample(np.random.default_rng(3), (steps, b)))
    for i in range(steps):
        (0.5 * (model(x[i]).squeeze(-1) - y[i]).square().mean()).backward()
        probe.step(batch_size=b)
        model.zero_grad()
    assert probe.source == "per_example"
    rows = sink.series("")
    assert rows[0]["b_small"] == 1 and rows[0]["b_big"] == b
    assert_truth(rows, truth)


def test_unequal_micro_batches_sum_over_n(
    problem: tuple[LeastSquares, np.ndarray, dict[str, float]],
) -> None:
    """Hugging Face style: summed loss / the step's item count.

    Micro-batches of 24, 32, 40, 32; 400 steps.
    """
    p, w, truth = problem
    steps, sizes = 400, (24, 32, 40, 32)
    model, sink = lsq_model(p, w), ListSink()
    probe = GradientNoiseProbe(model, sink, source="micro", micro_loss="sum/N")
    x, y = (torch.from_numpy(a) for a in p.sample(np.random.default_rng(4), (steps, sum(sizes))))
    bounds = np.cumsum((0, *sizes))
    for i in range(steps):
        for lo, hi in itertools.pairwise(bounds):
            loss = 0.5 * (model(x[i, lo:hi]).squeeze(-1) - y[i, lo:hi]).square().sum()
            (loss / sum(sizes)).backward()
            probe.micro_step(batch_size=int(hi - lo))
        probe.step()
        model.zero_grad()
    rows = sink.series("")
    assert rows[0]["b_big"] == pytest.approx(128)
    assert rows[0]["b_small"] == pytest.approx(
        4 / (1 / 24 + 1 / 32 + 1 / 40 + 1 / 32)
    )  # harmonic mean
    assert_truth(rows, truth)


def _token_batch(
    p: LeastSquares, rng: np.random.Generator, n: int, t_max: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Variable-length sequences of i.i.d. tokens, right-padded with garbage."""
    x, y = p.sample(rng, (n, t_max))
    lengths = rng.integers(1, t_max + 1, size=n)
    mask = np.arange(t_max)[None, :] < lengths[:, None]
    x = np.where(mask[..., None], x, 100.0 * rng.normal(size=x.shape))
    return torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(mask)


def test_per_example_tokens_padded_variable_length(
    problem: tuple[LeastSquares, np.ndarray, dict[str, float]],
) -> None:
    """Units = tokens: loss averaged over the real tokens, padding excluded.

    300 steps of 128 sequences of 1-8 tokens.
    """
    p, w, truth = problem
    steps, n, t_max = 300, 128, 8
    model, sink = lsq_model(p, w), ListSink()
    probe = GradientNoiseProbe(model, sink, source="per_example", units="tokens")
    rng = np.random.default_rng(5)
    for _ in range(steps):
        x, y, mask = _token_batch(p, rng, n, t_max)
        per_token = 0.5 * (model(x).squeeze(-1) - y).square()
        n_tokens = int(mask.sum())
        (per_token[mask].sum() / n_tokens).backward()
        probe.step(batch_size=n_tokens, item_counts=mask.sum(1))
        model.zero_grad()
    rows = sink.series("")
    assert rows[0]["b_big"] < n * t_max  # real tokens, not padded ones
    assert_truth(rows, truth)


def test_accumulation_tokens_sum_over_n(
    problem: tuple[LeastSquares, np.ndarray, dict[str, float]],
) -> None:
    """Micro-batches of variable real token counts, sum / total tokens (HF); 300 steps."""
    p, w, truth = problem
    steps, k, n, t_max = 300, 4, 32, 8
    model, sink = lsq_model(p, w), ListSink()
    probe = GradientNoiseProbe(model, sink, source="micro", units="tokens", micro_loss="sum/N")
    rng = np.random.default_rng(6)
    for _ in range(steps):
        micro = [_token_batch(p, rng, n, t_max) for _ in range(k)]
        total = sum(int(m.sum()) for _, _, m in micro)
        for x, y, mask in micro:
            per_token = 0.5 * (model(x).squeeze(-1) - y).square()
            (per_token[mask].sum() / total).backward()
            probe.micro_step(batch_size=int(mask.sum()))
        probe.step()
        model.zero_grad()
    assert_truth(sink.series(""), truth)
