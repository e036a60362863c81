"""Hessian-aware B_noise = tr(H Sigma)/(G^T H G) against the closed form (docs/science.md).

Least squares, d = 6, S with eigenvalues 0.5..3.0 (non-isotropic), sigma = 0.5, and w - w* along
S's smallest eigenvector, where B_noise (137.5) is four times B_simple (32.5): an estimator that
returned B_simple, or ignored H, would fail. 500 samples of batches 16 / 1024 (fixed seed).
"""

from __future__ import annotations

import numpy as np
import pytest

from noisescope.torch import hessian_noise_scale
from tests.estimators.lsq_truth import LeastSquares
from tests.probes.lsq_torch import Sampler, lsq_model, mean_loss


def test_b_noise_matches_closed_form_and_differs_from_b_simple() -> None:
    p = LeastSquares.make(d=6, sigma=0.5, seed=0, eig_range=(0.5, 3.0))
    _, eigvecs = np.linalg.eigh(p.cov)
    w = p.w_star + eigvecs[:, 0]
    truth = p.truth(w)
    assert truth["b_noise"] == pytest.approx(137.5)
    assert truth["b_simple"] == pytest.approx(32.5)
    est = hessian_noise_scale(
        lsq_model(p, w), mean_loss, Sampler(p, 3), b_small=16, b_big=1024, n_samples=500
    )
    b_noise, b_simple = est.b_noise.b_simple, est.b_simple.b_simple
    assert b_noise is not None
    assert b_simple is not None
    assert abs(b_noise.value / truth["b_noise"] - 1) < 0.10
    assert b_noise.lo <= truth["b_noise"] <= b_noise.hi
    assert est.b_noise.g_sq is not None
    assert est.b_noise.g_sq.lo <= truth["g_h_g"] <= est.b_noise.g_sq.hi
    assert est.b_noise.trace_sigma is not None
    assert est.b_noise.trace_sigma.lo <= truth["trace_h_sigma"] <= est.b_noise.trace_sigma.hi
    # the same batches give B_simple, clearly apart from B_noise
    assert b_simple.lo <= truth["b_simple"] <= b_simple.hi
    assert b_simple.hi < truth["b_noise"] / 2


def test_b_noise_rejects_equal_batch_sizes() -> None:
    p = LeastSquares.make()
    with pytest.raises(ValueError, match="b_small < b_big"):
        hessian_noise_scale(lsq_model(p, p.w_star), mean_loss, Sampler(p, 0), b_small=8, b_big=8)
