"""Runs of several model sizes of one task, with branch runs, posted through the client to a
running server: for the Compare runs page's model-size chart (tests and screenshots).

Each "model" is noisy least squares in ``d`` dimensions (``harness.lsq_branch``; its
``n_params`` is ``d``) trained by SGD at batch 4. Its samples are the two-batch estimator's
squared norms drawn around the exact |G|² = |Sδ|² and tr(Σ) = |Sδ|² + (δᵀSδ + σ²)·tr S of the
current weights (docs/science.md, "Ground truth for tests"), with the exact loss and the
examples seen; at each
branch step it logs its evaluation loss and ``noisescope.branch`` runs its branches.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import noisescope
from harness.lsq_branch import NoisyLeastSquares, logged_plan
from noisescope import branch

__all__ = ["BRANCH_STEPS", "PROJECT", "SIZES", "TASK", "post_model_sizes", "run_id"]

PROJECT, TASK = "scaling", "lsq"
#: run name -> dimension (its ``config["n_params"]``)
SIZES = {"lsq-d16": 16, "lsq-d64": 64}
BRANCH_STEPS = (50, 200, 600)
BATCH, LR, B_SMALL, B_BIG = 8, 0.05, 8.0, 32.0


def run_id(name: str) -> str:
    """The parent run's id (fixed, so a screenshot's URL can name it)."""
    return f"{name}-{PROJECT}"


def _log_step(
    run: noisescope.Run, task: NoisyLeastSquares, step: int, rng: np.random.Generator
) -> None:
    s, delta = task.s, task.w - task.w_star
    g_sq = float(((s * delta) ** 2).sum())
    trace_sigma = g_sq + (float(delta @ (s * delta)) + task.sigma**2) * float(s.sum())
    noise = 1.0 + 0.05 * rng.standard_normal(2)
    run.log_sample(
        step,
        B_SMALL,
        B_BIG,
        float((g_sq + trace_sigma / B_SMALL) * noise[0]),
        float((g_sq + trace_sigma / B_BIG) * noise[1]),
        examples=float(step * BATCH),
        loss=task.evaluate(),
    )


def post_model_sizes(url: str, tmp: Path) -> dict[str, str]:
    """Post the runs and their branches; returns run name -> run id (parents only)."""
    ids: dict[str, str] = {}
    for name, d in SIZES.items():
        task = NoisyLeastSquares(d=d)
        rng = np.random.default_rng(d)
        parent = noisescope.init(
            url,
            project=PROJECT,
            task=TASK,
            name=name,
            run_id=run_id(name),
            config={"n_params": d, "optimizer": "sgd", "lr": LR},
            batch_size=BATCH,
            dir=tmp / "spool",
            quiet=True,
        )
        step = 0
        for branch_step in BRANCH_STEPS:
            while step < branch_step:
                task.sgd(BATCH, LR, 1, rng)
                step += 1
                _log_step(parent, task, step, rng)
            parent.log(step, eval_loss=task.evaluate())
            plan, log = logged_plan(
                parent,
                url,
                {"dir": tmp / "spool", "quiet": True},
                step=step,
                batch_size=BATCH,
                lr=LR,
                multipliers=(1, 2, 4, 8, 16, 32),
                budget=4096,
                lr_rule="linear",
            )
            branch.run(plan, task, tmp / f"store_{name}_{step}", log=log)
        parent.finish()
        ids[name] = parent.id
    return ids
