"""Closed-form truth for least squares with Gaussian inputs (docs/science.md eq. 8).

Per-example loss l = 1/2 (x^T w - y)^2, x ~ N(0, S), y = x^T w* + eps, eps ~ N(0, sigma^2),
delta = w - w*. Isserlis' theorem gives G, tr(Sigma), tr(H Sigma) and G^T H G exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float64]


@dataclass(frozen=True)
class LeastSquares:
    cov: Array  # S, non-isotropic
    w_star: Array
    sigma: float

    @classmethod
    def make(
        cls,
        d: int = 6,
        sigma: float = 0.5,
        seed: int = 0,
        eig_range: tuple[float, float] = (0.3, 2.5),
    ) -> LeastSquares:
        rng = np.random.default_rng(seed)
        q, _ = np.linalg.qr(rng.normal(size=(d, d)))
        eig = np.linspace(*eig_range, d)
        return cls(cov=(q * eig) @ q.T, w_star=rng.normal(size=d), sigma=sigma)

    @property
    def d(self) -> int:
        return int(self.cov.shape[0])

    def truth(self, w: Array) -> dict[str, float]:
        s, delta = self.cov, w - self.w_star
        s2, s3 = s @ s, s @ s @ s
        d_s_d = float(delta @ s @ delta)
        g_sq = float(delta @ s2 @ delta)
        trace_sigma = (d_s_d + self.sigma**2) * float(np.trace(s)) + g_sq
        trace_h_sigma = (d_s_d + self.sigma**2) * float(np.trace(s2)) + float(delta @ s3 @ delta)
        g_h_g = float(delta @ s3 @ delta)
        return {
            "g_sq": g_sq,
            "trace_sigma": trace_sigma,
            "b_simple": trace_sigma / g_sq,
            "trace_h_sigma": trace_h_sigma,
            "g_h_g": g_h_g,
            "b_noise": trace_h_sigma / g_h_g,
        }

    def sample(self, rng: np.random.Generator, shape: tuple[int, ...]) -> tuple[Array, Array]:
        chol = np.linalg.cholesky(self.cov)
        x = rng.normal(size=(*shape, self.d)) @ chol.T
        y = x @ self.w_star + self.sigma * rng.normal(size=shape)
        return x, y

    def per_example_grads(self, w: Array, x: Array, y: Array) -> Array:
        """g_i = x_i (x_i^T w - y_i), the gradient of 1/2 (x^T w - y)^2."""
        return x * (x @ w - y)[..., None]
