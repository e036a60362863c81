"""The study's records handed to noisescope.sweep, and the report built from its answer."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytest

from experiments import report
from experiments.analysis import (
    analyse,
    b_simple_curve,
    b_simple_per_batch,
    noise_buckets,
    run_name,
    to_sweep_run,
    to_sweep_runs,
)
from experiments.tasks import TASKS
from noisescope import sweep
from noisescope.estimators import two_batch_estimates


def _samples(n_steps: int, g_sq: float, trace_sigma: float, b: float) -> dict[str, list[float]]:
    """Noise-free two-batch samples, |G_B|^2 = |G|^2 + tr(Sigma)/B (docs/science.md eq. 1)."""
    b_small = b / 4
    return {
        "step": [float(s) for s in range(1, n_steps + 1)],
        "b_small": [b_small] * n_steps,
        "b_big": [b] * n_steps,
        "g_small_sq": [g_sq + trace_sigma / b_small] * n_steps,
        "g_big_sq": [g_sq + trace_sigma / b] * n_steps,
        "loss": [1.0] * n_steps,
    }


def _record(
    batch_size: int, lr: float, steps_to_target: float, target: float = 1.0, seed: int = 0
) -> dict[str, Any]:
    """A cached run: the loss falls linearly from 2 and crosses ``target`` at
    ``steps_to_target``; B_simple is 40 throughout."""
    slope = (2.0 - target) / steps_to_target
    n = int(3 * steps_to_target)
    steps = [n * i / 100 for i in range(101)]
    return {
        "batch_size": batch_size,
        "batch_size_units": batch_size,
        "lr": lr,
        "seed": seed,
        "status": "reached",
        "steps": n,
        "wall_s": 1.0,
        "evals": {"step": steps, "loss": [max(2.0 - slope * s, 0.01) for s in steps]},
        "samples": _samples(n, 2.0, 80.0, batch_size),
    }


S_MIN, B_CRIT = 50.0, 64.0
SIZES = (4, 8, 16, 32, 64, 128, 256)


def _sweep_records() -> list[dict[str, Any]]:
    """S = S_min(1 + B_crit/B) with a few per cent of scatter, and a slower lr per batch."""
    records = []
    for i, b in enumerate(SIZES):
        s = S_MIN * (1 + B_CRIT / b) * (1 + 0.03 * (-1) ** i)
        records.append(_record(b, 0.1, s))
        records.append(_record(b, 0.01, 3 * s))
    return records


def test_a_record_becomes_what_the_server_would_receive() -> None:
    record = _record(8, 0.2, 100.0, seed=2)
    record["evals"]["loss"][-1] = math.inf  # a diverged last evaluation is never sent
    run = to_sweep_run(record)
    assert run.uid == run_name(8, 0.2, 2) == "B8-lr0.2-s2"
    assert run.batch_size == 8.0 and run.lr == 0.2
    assert len(run.steps) == len(run.losses) == 100
    assert all(math.isfinite(x) for x in run.losses)
    assert len(run.noise) == record["steps"]
    bucket = run.noise[9]
    g_sq, trace_sigma = two_batch_estimates(
        2.0, 8.0, *(record["samples"][k][9] for k in ("g_small_sq", "g_big_sq"))
    )
    assert (bucket.step_lo, bucket.step_hi, bucket.n) == (10.0, 10.0, 1.0)
    assert (bucket.sum_g_sq, bucket.sum_trace_sigma) == (g_sq, trace_sigma)


def test_noise_buckets_follow_changing_batch_sizes() -> None:
    samples: dict[str, Sequence[float]] = {
        "step": [1.0, 2.0, 3.0],
        "b_small": [1.0, 1.0, 2.0],
        "b_big": [4.0, 4.0, 8.0],
        "g_small_sq": [5.0, 6.0, 7.0],
        "g_big_sq": [2.0, 3.0, 4.0],
    }
    buckets = noise_buckets(samples)
    for i, b in enumerate(buckets):
        expected = two_batch_estimates(
            samples["b_small"][i],
            samples["b_big"][i],
            samples["g_small_sq"][i],
            samples["g_big_sq"][i],
        )
        assert (b.sum_g_sq, b.sum_trace_sigma) == expected


def test_analyse_recovers_the_model_through_noisescope_sweep() -> None:
    runs = to_sweep_runs(_sweep_records())
    result = analyse(runs, [1.0], task="t")
    assert result.loss_source == "eval"
    (t,) = result.targets
    assert t.determined, t.warnings
    assert len(t.points) == len(SIZES)
    assert all(p.lr == 0.1 for p in t.points)
    assert t.b_crit == pytest.approx(B_CRIT, rel=0.1)
    assert t.b_crit_lo is not None and t.b_crit_hi is not None
    assert t.b_crit is not None
    assert t.b_crit_lo < t.b_crit < t.b_crit_hi
    # The same numbers as calling the library directly: one analysis, not two.
    direct = sweep.analyse(runs, [1.0], loss_source="eval").targets[0]
    assert (t.b_crit, t.b_crit_lo, t.b_crit_hi) == (
        direct.b_crit,
        direct.b_crit_lo,
        direct.b_crit_hi,
    )
    assert t.b_simple == pytest.approx(40.0)
    per_b = b_simple_per_batch(runs, t)
    assert sorted(per_b) == [float(b) for b in SIZES]
    assert all(v[0] == pytest.approx(40.0) for v in per_b.values())


def test_b_simple_curve_is_b_simple_at_loss_at_each_evaluation() -> None:
    record = _record(16, 0.1, 100.0)
    # B_simple 10 early, 1000 late, so windows differ along the run.
    sm = record["samples"]
    for i, s in enumerate(sm["step"]):
        tr = 2.0 * (10.0 if s < 80 else 1000.0)
        sm["g_small_sq"][i] = 2.0 + tr / 4.0
        sm["g_big_sq"][i] = 2.0 + tr / 16.0
    run = to_sweep_run(record)
    curve = b_simple_curve(run)
    assert len(curve) == len(run.steps) - 1  # not at step 0
    for step, loss, value in curve[::10]:
        assert value == sweep.b_simple_at_loss([run], {run.uid: step})[0]
        assert loss in run.losses
    assert curve[-1][2] == pytest.approx(1000.0)


def _task_result(records: list[dict[str, Any]], targets: list[float]) -> report.TaskResult:
    runs = to_sweep_runs(records)
    spec = TASKS["lsq"].sized(True)
    return report.TaskResult(spec, analyse(runs, targets, units="examples"), runs, records, "f.png")


def test_report_gives_b_crit_with_its_interval() -> None:
    res = _task_result(_sweep_records(), [1.5, 1.0])
    text, misses = report.task_section(res)
    t = res.report.targets[-1]
    assert t.b_crit_lo is not None and t.b_crit_hi is not None
    cell = f"{t.b_crit:.3g} [{t.b_crit_lo:.3g}–{t.b_crit_hi:.3g}]"
    assert f"| 1 | {len(SIZES)} |" in text and cell in text
    assert "± s.e." not in text
    assert t.b_crit is not None
    assert report.ratio(t) == pytest.approx(40.0 / t.b_crit)
    assert not any("not determined" in m for m in misses)


def test_report_says_not_determined_and_why() -> None:
    # Steps that do not fall with the batch size: no hyperbola through them.
    records = [_record(b, 0.1, 100.0 + b) for b in (8, 32, 128)]
    res = _task_result(records, [1.0])
    (t,) = res.report.targets
    assert not t.determined and t.warnings
    text, misses = report.task_section(res)
    assert "| not determined" in text
    assert t.warnings[0] in text
    assert report.ratio(t) is None
    assert "lsq @ 1: B_crit not determined" in misses
    page = report.render([res], "s.png", "python -m experiments", "")
    assert "**0 of 0** (task, target) pairs where B_crit is determined (of 1)" in page
    assert "none determined (0 of 1)" in page
