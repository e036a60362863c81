"""Synthetic batch-size sweeps whose critical batch size is known in closed form.

A run at batch size B with a learning rate of relative speed q (q = 1 is the best learning rate
at every batch size) has the loss

    L(s) = L_inf + (L0 - L_inf) exp(-q s / (tau (1 + B_crit / B)))

so it reaches a target L after S = (tau / q) ln((L0 - L_inf)/(L - L_inf)) (1 + B_crit/B) steps:
the best learning rates trace docs/science.md's S = S_min (1 + B_crit/B) exactly, the others are
slower by 1/q. Seeds scale tau by a log-normal factor, so the median seed is the model.
Noise samples follow eq. (1) exactly with |G|^2 = 1 and tr(Sigma) = ``b_simple``, so B_simple at
any loss is ``b_simple``. ``post`` writes a sweep through the real HTTP API.
"""

from __future__ import annotations

import math
import random
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness.http_clients import HttpClient
from noisescope import sweep

__all__ = ["SynthRun", "make_sweep", "post", "steps_to", "to_sweep_runs"]

L0, L_INF, TAU = 3.0, 0.5, 40.0


@dataclass(frozen=True)
class SynthRun:
    uid: str
    batch_size: float
    lr: float
    q: float
    tau: float
    steps: int
    b_simple: float
    b_crit: float

    def loss(self, step: float) -> float:
        rate = self.q / (self.tau * (1.0 + self.b_crit / self.batch_size))
        return L_INF + (L0 - L_INF) * math.exp(-rate * step)


def steps_to(target: float, batch_size: float, b_crit: float, q: float = 1.0) -> float:
    """Steps the model needs at ``batch_size`` to reach ``target`` (tau unscaled)."""
    return TAU / q * math.log((L0 - L_INF) / (target - L_INF)) * (1.0 + b_crit / batch_size)


def make_sweep(
    b_crit: float,
    batch_sizes: Sequence[float],
    *,
    lrs: Sequence[tuple[float, float]] = ((0.1, 0.55), (0.3, 1.0), (1.0, 0.7)),
    seeds: int = 1,
    seed_spread: float = 0.0,
    b_simple: float | None = None,
    final_loss: float = 0.7,
    rng: random.Random | None = None,
) -> list[SynthRun]:
    """Runs at every (batch size, learning rate, seed); ``lrs`` pairs a learning rate with its
    relative speed q. Each run trains until its model loss reaches ``final_loss``."""
    rng = rng or random.Random(0)
    runs = []
    for b in batch_sizes:
        for lr, q in lrs:
            for _ in range(seeds):
                tau = TAU * math.exp(rng.gauss(0.0, seed_spread)) if seed_spread else TAU
                steps = math.ceil(steps_to(final_loss, b, b_crit, q) * tau / TAU) + 5
                runs.append(
                    SynthRun(
                        uuid.uuid4().hex, float(b), lr, q, tau, steps,
                        b_simple if b_simple is not None else b_crit / 2, b_crit,
                    )
                )  # fmt: skip
    return runs


def _eval_steps(run: SynthRun) -> list[int]:
    """Evaluations at step 0 and then every ~4% of the steps so far (as the experiments do)."""
    out, s = [0], 1
    while s <= run.steps:
        out.append(s)
        s += max(1, int(s * 0.04))
    return out


def to_sweep_runs(runs: Sequence[SynthRun], *, noise: bool = True) -> list[sweep.SweepRun]:
    """The same runs as ``noisescope.sweep`` inputs, crossed on their evaluation curves; noise
    samples (with ``noise``) as exact sums over buckets of ~1% of each run."""
    out = []
    for r in runs:
        steps = _eval_steps(r)
        width = max(1, r.steps // 100)
        buckets = [
            sweep.NoiseBucket(lo, min(lo + width - 1, r.steps), n, float(n), n * r.b_simple)
            for lo in range(1, r.steps + 1, width)
            for n in [min(lo + width - 1, r.steps) - lo + 1]
        ]
        out.append(
            sweep.SweepRun(
                r.uid,
                f"B{r.batch_size:g}-lr{r.lr:g}",
                r.batch_size,
                r.lr,
                [float(s) for s in steps],
                [r.loss(s) for s in steps],
                buckets if noise else [],
            )
        )
    return out


def post(
    client: HttpClient,
    runs: Sequence[SynthRun],
    *,
    project: str,
    task: str,
    evals: bool = True,
    train_noise: float = 0.0,
    rng: random.Random | None = None,
) -> None:
    """PUT each run, POST its samples (training loss with relative noise ``train_noise`` per
    step) and, with ``evals``, its evaluation losses as ``eval`` events."""
    rng = rng or random.Random(1)
    for r in runs:
        body = {
            "project": project,
            "task": task,
            "name": f"B{r.batch_size:g}-lr{r.lr:g}-{r.uid[:4]}",
            "batch_size": r.batch_size,
            "config": {"lr": r.lr},
            "status": "finished",
        }
        answer = client.put(f"/api/v1/runs/{r.uid}", json=body)
        assert answer.status_code in (200, 201), answer.text
        b_small = r.batch_size / 4
        steps = list(range(1, r.steps + 1))
        wobble = [0.3 * (1 if s % 2 else -1) for s in steps]  # cancels over pairs of steps
        columns: dict[str, list[Any]] = {
            "seq": steps,
            "step": steps,
            "examples": [s * r.batch_size for s in steps],
            "b_small": [b_small] * len(steps),
            "b_big": [r.batch_size] * len(steps),
            "g_small_sq": [1.0 + w + r.b_simple / b_small for w in wobble],
            "g_big_sq": [1.0 + w + r.b_simple / r.batch_size for w in wobble],
            "loss": [r.loss(s) * (1.0 + train_noise * rng.gauss(0.0, 1.0)) for s in steps],
            "lr": [r.lr] * len(steps),
            "time": [1_700_000_000.0 + s for s in steps],
            "series": [""] * len(steps),
        }
        answer = client.post(f"/api/v1/runs/{r.uid}/samples", json={"columns": columns})
        assert answer.status_code == 200, answer.text
        if evals:
            events = [
                {"seq": i, "step": s, "kind": "eval", "payload": {"loss": r.loss(s)}}
                for i, s in enumerate(_eval_steps(r))
            ]
            answer = client.post(f"/api/v1/runs/{r.uid}/events", json={"events": events})
            assert answer.status_code == 200, answer.text
