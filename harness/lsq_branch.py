"""Noisy least squares as a :class:`noisescope.branch.Branchable`, with its exact expectation.

ℓ = ½(xᵀw − y)², x ~ N(0, S) with S = diag(s), y = xᵀw* + ε, ε ~ N(0, σ²), δ = w − w*. One SGD
step at batch B and lr η is δ' = δ − η G_B with E[G_B | δ] = Sδ and Cov[G_B | δ] = Σ(δ)/B,
Σ(δ) = SδδᵀS + (δᵀSδ + σ²) S (Isserlis; docs/science.md, "Ground truth for tests"). For diagonal
S the diagonal p = E[δ∘δ] evolves on its own:

    p' = (1 − η s)² p + (η²/B) (s² p + (sᵀp + σ²) s),     E[ℓ] = ½ (sᵀp + σ²)

so the expected loss after any branch is known in closed form, and with it the local critical
batch size a branch sweep should measure.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from noisescope import Run, Transport, branch
from noisescope.branch import Branch, BranchPlan, BranchSweep
from noisescope.estimators import LocalCriticalBatch, local_critical_batch

Array = NDArray[np.float64]


class NoisyLeastSquares:
    def __init__(self, d: int = 32, sigma: float = 1.0, kappa: float = 100.0, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.s = np.geomspace(1.0, 1.0 / kappa, d)
        self.w_star = rng.standard_normal(d) / np.sqrt(self.s) / np.sqrt(d) * 4.0
        self.sigma = sigma
        self.w = np.zeros(d)
        self.trained: list[str] = []

    # --- Branchable
    def save(self) -> Array:
        return self.w.copy()

    def restore(self, state: Array) -> None:
        self.w = state.copy()

    def train(self, branch: Branch, run: object | None) -> None:
        self.trained.append(branch.key)
        # Seed j draws the same examples at every batch size (the plan's paired seeds).
        rng = np.random.default_rng([branch.seed, branch.step])
        self.sgd(branch.batch_size, branch.lr, branch.steps, rng, examples=branch.examples)

    def evaluate(self) -> float:
        delta = self.w - self.w_star
        return float(0.5 * (delta @ (self.s * delta) + self.sigma**2))

    # --- the parent run and the truth
    def sgd(
        self,
        batch_size: int,
        lr: float,
        steps: int,
        rng: np.random.Generator,
        examples: int | None = None,
    ) -> None:
        d = self.w.shape[0]
        n = examples or batch_size * steps
        x_all = rng.standard_normal((n, d)) * np.sqrt(self.s)
        y_all = x_all @ self.w_star + self.sigma * rng.standard_normal(n)
        for i in range(steps):
            x = x_all[i * batch_size : (i + 1) * batch_size]
            y = y_all[i * batch_size : (i + 1) * batch_size]
            self.w = self.w - lr * (x * (x @ self.w - y)[:, None]).mean(axis=0)

    def expected_loss(self, batch_size: int, lr: float, steps: int) -> float:
        s, sigma2 = self.s, self.sigma**2
        p = (self.w - self.w_star) ** 2
        for _ in range(steps):
            p = (1 - lr * s) ** 2 * p + (lr**2 / batch_size) * (s**2 * p + (s @ p + sigma2) * s)
        return float(0.5 * (s @ p + sigma2))

    def b_noise(self) -> float:
        s, delta = self.s, self.w - self.w_star
        g_h_g = float(delta @ (s**3 * delta))
        return ((float(delta @ (s * delta)) + self.sigma**2) * float((s**2).sum()) + g_h_g) / g_h_g

    def exact_local(self, plan: BranchPlan) -> LocalCriticalBatch:
        """The local critical batch of ``plan`` from the expected losses (no sampling noise)."""
        sizes: list[float] = []
        losses: list[list[float]] = []
        for m in plan.multipliers:
            branch = next(b for b in plan.branches if b.multiplier == m)
            sizes.append(branch.batch_size)
            losses.append([self.expected_loss(branch.batch_size, branch.lr, branch.steps)])
        return local_critical_batch(sizes, losses, epsilon=plan.epsilon, level=plan.level)


class Killed(Exception):
    """What ``DiesAfter`` raises: the job killed mid-sweep."""


class DiesAfter(NoisyLeastSquares):
    """Killed (an exception out of train) once it has trained ``n`` branches."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def train(self, branch: Branch, run: object | None) -> None:
        if len(self.trained) >= self.n:
            raise Killed
        super().train(branch, run)


def logged_plan(
    parent: Run, url: str, init_kwargs: Mapping[str, object], **plan: Any
) -> tuple[BranchPlan, branch.LogTo]:
    """A two-seed branch point of ``parent`` at epsilon 0.02 (``plan``: ``branch.plan``'s
    other arguments), and its branch runs logged to ``url`` under the parent's project and task
    (``init_kwargs``: ``noisescope.init``'s)."""
    point = branch.plan(seeds=2, epsilon=0.02, parent_run_id=parent.id, **plan)
    return point, branch.LogTo(parent.project, parent.task, url, init_kwargs=init_kwargs)


def branch_logged_parent(
    parent: Run, url: str, tmp: Path, *, quiet: bool = False, transport: Transport | None = None
) -> BranchSweep:
    """The servers' and the dashboard's fixture: a least-squares parent trained 50 SGD steps,
    its evaluation logged, then branched at step 50 (4 sizes x 2 seeds) with every branch run
    logged to ``url`` and linked to ``parent``."""
    lsq = NoisyLeastSquares()
    lsq.sgd(8, 0.2, 50, np.random.default_rng(1))
    parent.log(50, eval_loss=lsq.evaluate())
    init_kwargs: dict[str, object] = {"dir": tmp / "spool", **({"quiet": True} if quiet else {})}
    if transport is not None:  # e.g. an in-process server's (harness/inprocess.py)
        init_kwargs["transport"] = transport
    plan, log = logged_plan(
        parent,
        url,
        init_kwargs,
        step=50,
        batch_size=4,
        lr=0.3,
        multipliers=(1, 4, 16, 64),
        budget=2048,
        lr_rule="constant",
    )
    return branch.run(plan, lsq, tmp / "store", log=log)
