"""The probe on the models people train (harness/zoo), against their exact noise scale.

Each zoo case is a tiny real model at fixed weights with a finite data set of N = 64 examples
(float64, dropout 0). The truth (harness/zoo/truth.py) comes from each example's gradient by
its own backward: their Gram matrix K gives the exact G, tr(Sigma) and B_simple for batches drawn
with replacement, and, for any batch, exactly what the probe must log. Units are examples, the
loss the mean over the batch's examples (a language model's: over its tokens, all real), except
``gpt2_padded``: units tokens, the loss the sum over the real tokens divided by their count.

- exact rows: for given batches, each logged (b_small, b_big, g_small_sq, g_big_sq) equals its
  value from K: per-example source (the default, one backward per step), micro-batch source;
  and PerExampleNorms' per-example squared norms equal brute force, example by example;
- statistics: the default probe over S steps of batches drawn with replacement, one backward
  per step and 4 micro-batches per step: B_simple of the window within 4 sigma of the truth
  (sigma: the estimator's spread over windows of the same batches drawn from K, no model);
- the brute-force gradients equal torch.func's ``vmap(grad)`` where torch.func runs the model.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from harness.zoo import BUILDERS, Truth, ZooCase, brute_force_grads, func_grads, trainable
from harness.zoo.truth import window_b_simple
from noisescope.torch import GradientNoiseProbe, PerExampleNorms
from tests.probes.zoo_loop import b_simple_spread, expected_row, make_probe, row_of, run_steps

CASES = list(BUILDERS)
STEPS = 16  # statistical tests: steps per window (sigma from simulated windows of this shape)
BATCH = 64  # examples per step (N = 64, drawn with replacement)
K = 4  # micro-batches per step
SIGMAS = 4.0
# The probe sums squared norms in float32: relative 1e-7 at best.
RTOL_PER_EXAMPLE = 1e-6
RTOL_MICRO = 1e-6

# torch.func cannot run these: saved-tensor hooks (checkpointing), nn.LSTM's batching rule,
# data-dependent shapes (x[mask] routing)
NO_FUNC = {"nanogpt_checkpoint", "llama_checkpoint", "lstm", "moe"}


@functools.cache
def truth_of(name: str) -> Truth:
    case = BUILDERS[name]()
    return Truth.of(brute_force_grads(case), case.counts)


@functools.cache
def spread(name: str, k: int) -> tuple[float, float]:
    """zoo_loop.b_simple_spread for the test's window shape."""
    return b_simple_spread(truth_of(name), STEPS, BATCH, k)


def _run(
    case: ZooCase, probe: GradientNoiseProbe, batches: list[torch.Tensor], k: int
) -> list[dict[str, float]]:
    """The training loop (zoo_loop.run_steps): no error, every step logged."""
    rows = run_steps(case, probe, batches, k)
    assert probe.error is None
    assert len(rows) == len(batches)
    return rows


# --- exact rows ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CASES)
def test_per_example_norms_match_brute_force(name: str) -> None:
    """PerExampleNorms' squared norms of each example's share of the batch loss's gradient
    (summed over parameters) against brute force (K's diagonal over the batch's items^2)."""
    case, truth = BUILDERS[name](), truth_of(name)
    params = trainable(case.model)
    norms = PerExampleNorms(case.model, {id(p): i for i, p in enumerate(params)})
    norms.armed = True
    idx = torch.arange(0, case.n, 5)
    case.batch_loss(idx).backward()
    got = norms.take(torch.device("cpu")).double().sum(0).numpy()
    norms.remove()
    want = truth.gram[idx, idx] / case.items(idx) ** 2
    np.testing.assert_allclose(got, want, rtol=RTOL_PER_EXAMPLE)


@pytest.mark.parametrize("name", CASES)
def test_micro_batch_rows_are_exact(name: str) -> None:
    """source="micro", 4 micro-batches: each micro-batch's and the step's squared norms as K
    says. (Independent of per-example machinery: this checks the truth's K itself.)"""
    case, truth = BUILDERS[name](), truth_of(name)
    probe = make_probe(case, K, source="micro")
    gen = torch.Generator().manual_seed(12)
    batches = [torch.randint(0, case.n, (16,), generator=gen) for _ in range(2)]
    rows = _run(case, probe, batches, K)
    for row, idx in zip(rows, batches, strict=True):
        want = truth.micro_row([m.tolist() for m in idx.chunk(K)])
        np.testing.assert_allclose(row_of(row), want, rtol=RTOL_MICRO)


# --- statistics ----------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, K], ids=["one_backward", "accumulation"])
@pytest.mark.parametrize("name", CASES)
def test_noise_scale_matches_truth(name: str, k: int) -> None:
    """The default probe over STEPS steps of BATCH examples drawn with replacement (k
    micro-batches per step): the source auto picks, every step logged, each row as K says (one
    backward: B_small = 1 or the example's tokens, to float32 precision), and the window's B_simple
    within 4 sigma of the exact one (plus the estimator's own bias at this window, from K)."""
    case, truth = BUILDERS[name](), truth_of(name)
    probe = make_probe(case, k)
    gen = torch.Generator().manual_seed(13)
    batches = [torch.randint(0, case.n, (BATCH,), generator=gen) for _ in range(STEPS)]
    rows = _run(case, probe, batches, k)
    assert probe.source == ("per_example" if k == 1 else "micro"), probe.source_reason
    for row, idx in zip(rows, batches, strict=True):
        want = expected_row(truth, idx, k, row["b_small"])
        np.testing.assert_allclose(row_of(row), want, rtol=RTOL_PER_EXAMPLE)
    bias, sigma = spread(name, k)
    got = window_b_simple(rows) / truth.b_simple - 1.0
    print(f"{name} k={k}: B_simple {truth.b_simple:.3f}, window {got:+.3f} (bias {bias:+.3f}, "
          f"sigma {sigma:.3f})")  # fmt: skip
    assert abs(got) <= SIGMAS * sigma + abs(bias), (got, bias, sigma)


# --- the truth's per-example gradients ---------------------------------------------------------


@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")  # vmap of SDPA
@pytest.mark.parametrize("name", [n for n in CASES if n not in NO_FUNC])
def test_brute_force_matches_torch_func(name: str) -> None:
    case = BUILDERS[name]()
    want = func_grads(case)
    got = brute_force_grads(case)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
