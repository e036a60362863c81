"""The study's records handed to ``noisescope.sweep``, the one critical-batch analysis.

Crossings, the frontier (fastest learning rate per batch size, median over seeds), the S-E fit
with its Fieller interval and B_simple at the same loss all live in ``noisescope.sweep``; the
server's ``GET /api/v1/tasks/{project}/{task}/critical-batch`` runs the same code on what the
runs logged. This module only decides what each cached run record contributes, so that it is
exactly what the server receives:

- its loss curve: the finite evaluation losses (``Run.log(step, eval_loss=...)`` sends only
  finite ones), steps as logged;
- its noise samples: one ``sweep.NoiseBucket`` per step, the unbiased |𝒢|² and 𝒮 of
  ``estimators.two_batch_estimate_columns``;
- its batch size (task units per step) and learning rate, which group runs into seeds.

What is specific to the study's figures and tables is here too: B_simple per frontier batch
size, and B_simple along a run (both through ``sweep.b_simple_at_loss``).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Any

from noisescope import sweep
from noisescope.estimators import two_batch_estimate_columns

__all__ = [
    "BSimple",
    "analyse",
    "b_simple_curve",
    "b_simple_per_batch",
    "noise_buckets",
    "run_name",
    "to_sweep_run",
    "to_sweep_runs",
]

#: (value, lo, hi, reason) as ``sweep.b_simple_at_loss`` returns it.
BSimple = tuple[float | None, float | None, float | None, str | None]


def run_name(batch_size: int, lr: float, seed: int) -> str:
    """A run's name on the server, its cache file name and its uid in the analysis."""
    return f"B{batch_size}-lr{lr:.6g}-s{seed}"


def noise_buckets(samples: dict[str, Sequence[float]]) -> list[sweep.NoiseBucket]:
    """One bucket per step: the step's |𝒢|² and 𝒮 (consecutive steps with the same batch
    sizes are estimated as one column, the same floats as per step)."""
    steps = samples["step"]
    out: list[sweep.NoiseBucket] = []
    i = 0
    while i < len(steps):
        b_small, b_big = samples["b_small"][i], samples["b_big"][i]
        j = i
        while j < len(steps) and samples["b_small"][j] == b_small and samples["b_big"][j] == b_big:
            j += 1
        g_sq, trace_sigma = two_batch_estimate_columns(
            b_small, b_big, samples["g_small_sq"][i:j], samples["g_big_sq"][i:j]
        )
        for k in range(i, j):
            s = float(steps[k])
            out.append(sweep.NoiseBucket(s, s, 1.0, g_sq[k - i], trace_sigma[k - i]))
        i = j
    return out


def to_sweep_run(record: dict[str, Any]) -> sweep.SweepRun:
    """One cached run record as ``noisescope.sweep`` sees it (batch size in task units)."""
    ev = record["evals"]
    points = [(float(s), float(x)) for s, x in zip(ev["step"], ev["loss"], strict=True)]
    points = [p for p in points if math.isfinite(p[1])]
    return sweep.SweepRun(
        uid=run_name(record["batch_size"], record["lr"], record.get("seed", 0)),
        name=run_name(record["batch_size"], record["lr"], record.get("seed", 0)),
        batch_size=float(record["batch_size_units"]),
        lr=float(record["lr"]),
        steps=[p[0] for p in points],
        losses=[p[1] for p in points],
        noise=noise_buckets(record["samples"]),
    )


def to_sweep_runs(records: Iterable[dict[str, Any]]) -> list[sweep.SweepRun]:
    return [to_sweep_run(r) for r in records]


def analyse(
    runs: Sequence[sweep.SweepRun],
    targets: Sequence[float],
    *,
    project: str = "",
    task: str = "",
    units: str = "examples",
) -> sweep.CriticalBatchReport:
    """``sweep.analyse`` on the evaluation losses, at the task's fixed targets."""
    return sweep.analyse(runs, targets, project=project, task=task, units=units, loss_source="eval")


def b_simple_per_batch(
    runs: Sequence[sweep.SweepRun], result: sweep.TargetResult
) -> dict[float, BSimple]:
    """B_simple at the target per frontier batch size (its seeds pooled), to show how far
    the runs that make up the pooled value disagree."""
    by_uid = {r.uid: r for r in runs}
    crossings = {r.uid: r.steps for r in result.runs}
    return {
        p.batch_size: sweep.b_simple_at_loss([by_uid[u] for u in p.run_uids], crossings)
        for p in result.points
    }


def b_simple_curve(run: sweep.SweepRun) -> list[tuple[float, float, float | None]]:
    """(step, loss, B_simple) at each evaluation s of a run: B_simple at the loss reached at s,
    as ``sweep.b_simple_at_loss`` defines it (window [s/B_SIMPLE_WINDOW, s·B_SIMPLE_WINDOW])."""
    mids = [(b.step_lo + b.step_hi) / 2.0 for b in run.noise]
    out: list[tuple[float, float, float | None]] = []
    for s, loss in zip(run.steps, run.losses, strict=True):
        if s <= 0:
            continue
        # Only the buckets near s, so a long run costs its length, not length × evaluations.
        lo = bisect.bisect_left(mids, s / sweep.B_SIMPLE_WINDOW)
        hi = bisect.bisect_right(mids, s * sweep.B_SIMPLE_WINDOW)
        near = dataclasses.replace(run, noise=run.noise[max(0, lo - 1) : hi + 1])
        value = sweep.b_simple_at_loss([near], {run.uid: s})[0]
        out.append((float(s), float(loss), value))
    return out
