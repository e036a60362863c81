"""What the sweep checks before its answer is trusted (client/noisescope/sweep/_checks.py): an
undetermined B_crit is no number, diverged runs are left out, a frontier learning rate at an
edge of the grid and a frontier point from one seed are warned about; each check on a sweep
built to trigger it and silent on a clean one (harness/synthetic_sweep.py)."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import pytest

from harness.synthetic_sweep import make_sweep, to_sweep_runs
from noisescope import sweep

BATCHES = (16, 32, 64, 128, 256, 512)
B_CRIT = 200.0
#: The best learning rate inside the grid at every batch size (q = 1 for the middle one).
INSIDE = ((0.1, 0.55), (0.3, 1.0), (1.0, 0.7))


def _clean(seeds: int = 2) -> list[sweep.SweepRun]:
    return to_sweep_runs(
        make_sweep(B_CRIT, BATCHES, lrs=INSIDE, seeds=seeds, seed_spread=0.02, rng=random.Random(3))
    )


def _grid_or_seed_warnings(report: sweep.CriticalBatchReport) -> list[str]:
    return [
        w
        for t in report.targets
        for w in t.warnings
        if "learning rate" in w or "seed" in w or "diverged" in w
    ] + [w for w in report.warnings if "diverged" in w]


def test_a_clean_sweep_raises_none_of_the_checks() -> None:
    report = sweep.analyse(_clean(), loss_source="eval")
    assert report.targets and all(t.determined for t in report.targets)
    assert _grid_or_seed_warnings(report) == []
    assert report.excluded == []
    for t in report.targets:
        assert t.b_crit is not None and t.b_crit == t.b_crit_estimate


# --- an undetermined B_crit is not a number ------------------------------------------------


def test_an_undetermined_b_crit_is_none_and_the_estimate_says_what_it_is() -> None:
    runs = to_sweep_runs(make_sweep(B_CRIT, (1024, 2048, 4096, 8192), lrs=INSIDE))
    report = sweep.analyse(runs, loss_source="eval")
    assert report.targets
    for t in report.targets:
        assert not t.determined
        assert (t.b_crit, t.b_crit_lo, t.b_crit_hi) == (None, None, None)
        assert t.b_crit_estimate is not None and t.b_crit_estimate > 0
        assert t.warnings  # why it is not determined
        assert t.b_simple_vs_b_crit() is None


# --- learning rate at the edge of the grid --------------------------------------------------


def test_a_frontier_at_the_largest_learning_rate_names_the_batch_sizes_and_the_edge() -> None:
    rising = ((0.1, 0.55), (0.3, 0.8), (1.0, 1.0))  # the largest is fastest at every batch
    runs = to_sweep_runs(make_sweep(B_CRIT, BATCHES, lrs=rising, seeds=2, rng=random.Random(4)))
    report = sweep.analyse(runs, loss_source="eval")
    for t in report.targets:
        (edge,) = [w for w in t.warnings if "edge" in w or "largest" in w]
        assert "at batch sizes 16, 32, 64, 128, 256, 512" in edge
        assert "the largest tried there (lr 1)" in edge
        assert "upper bound" in edge and "try larger learning rates" in edge
        assert t.determined  # the fit is sound; the warning says how to read it


def test_the_smallest_edge_at_some_batch_sizes_and_a_single_lr_elsewhere() -> None:
    falling = ((0.1, 1.0), (0.3, 0.8), (1.0, 0.5))
    runs = [
        *make_sweep(B_CRIT, (16,), lrs=falling, seeds=2, rng=random.Random(5)),
        *make_sweep(B_CRIT, (32, 64, 128, 256), lrs=INSIDE, seeds=2, rng=random.Random(6)),
        *make_sweep(B_CRIT, (512,), lrs=((0.3, 1.0),), seeds=2, rng=random.Random(7)),
    ]
    report = sweep.analyse(to_sweep_runs(runs), loss_source="eval")
    for t in report.targets:
        said = " | ".join(t.warnings)
        assert "at batch size 16 the fastest learning rate is the smallest tried there" in said
        assert "try smaller learning rates" in said
        assert "at batch size 512 only one learning rate was tried (lr 0.3)" in said
        assert "not tuned there" in said
        assert "largest" not in said


# --- diverged runs ----------------------------------------------------------------------------


def test_divergence_is_a_rise_far_above_the_minimum_or_a_non_finite_loss() -> None:
    steps = [float(s) for s in range(0, 101, 5)]
    falling = [0.5 + 2.5 * math.exp(-s / 20) for s in steps]
    rng = random.Random(0)
    assert sweep.divergence(steps, falling) is None
    spike = [x + (2.0 if s == 50 else 0.0) for s, x in zip(steps, falling, strict=True)]
    assert sweep.divergence(steps, spike) is None  # one spike, recovered from
    flat = [2.3 + 0.02 * rng.gauss(0, 1) for _ in steps]  # a run that never learnt
    assert sweep.divergence(steps, flat) is None
    blown = [x if s <= 60 else 0.6 + (s - 60) * 0.06 for s, x in zip(steps, falling, strict=True)]
    why = sweep.divergence(steps, blown)
    assert why is not None and why.startswith("its loss rose from")
    assert "to 2.7 by step 100" in why  # the median over steps 90-100, not the last point
    nan = [*falling[:5], math.nan, *falling[6:]]
    assert sweep.divergence(steps, nan) == "its loss became nan at step 25"


def _diverged_run(uid: str = "blowup") -> sweep.SweepRun:
    """Batch 16 at a learning rate above the grid: fastest to every easy target, then it blows
    up to above where it started."""
    steps = [float(s) for s in range(0, 401, 10)]
    losses = [0.5 + 2.5 * math.exp(-s / 15) if s <= 150 else 0.5 + (s - 150) * 0.013 for s in steps]
    return sweep.SweepRun(uid, "B16-lr3", 16.0, 3.0, steps, losses)


def test_a_diverged_run_is_left_out_of_the_frontier_and_named_with_its_rise() -> None:
    runs = [*_clean(), _diverged_run()]
    report = sweep.analyse(runs, loss_source="eval")
    (out,) = report.excluded
    assert (out.uid, out.name, out.kind) == ("blowup", "B16-lr3", "diverged")
    assert out.reason.startswith("diverged: its loss rose from 0.5")
    (said,) = [w for w in report.warnings if "diverged" in w]
    assert "1 of 37 runs diverged" in said and "left out of the frontier" in said
    assert "B16-lr3 (its loss rose from" in said
    assert report.n_runs == 36
    for t in report.targets:
        assert all(r.uid != "blowup" for r in t.runs)
        assert all(p.lr != 3.0 for p in t.points)
        # the diverged lr bounds the grid: lr 1 at batch 16 is not the largest tried there
        assert not any("largest" in w for w in t.warnings)
    kept = sweep.analyse(runs, loss_source="eval", keep_diverged=True)
    assert kept.excluded == [] and kept.n_runs == 37
    assert any("kept in the analysis" in w for w in kept.warnings)
    easiest = kept.targets[0]
    assert any("blowup" in p.run_uids for p in easiest.points)  # it was fast, then it blew up


# --- seeds ------------------------------------------------------------------------------------


def _seed_counts(counts: Sequence[int]) -> list[sweep.SweepRun]:
    runs = []
    for b, n in zip(BATCHES, counts, strict=True):
        runs += make_sweep(
            B_CRIT, (b,), lrs=INSIDE, seeds=n, seed_spread=0.02, rng=random.Random(b)
        )
    return to_sweep_runs(runs)


def test_a_frontier_point_from_one_seed_among_several_says_how_many_each_has() -> None:
    report = sweep.analyse(_seed_counts([1, 3, 3, 1, 3, 3]), loss_source="eval")
    for t in report.targets:
        (said,) = [w for w in t.warnings if "seed" in w]
        assert said.startswith("at batch sizes 16, 128 the frontier point comes from a single")
        assert "(seeds per batch size: 16: 1; 32: 3; 64: 3; 128: 1; 256: 3; 512: 3)" in said
        assert "no spread measured" in said


def test_a_sweep_of_single_seeds_says_so_once_per_target() -> None:
    report = sweep.analyse(_clean(seeds=1), loss_source="eval")
    for t in report.targets:
        (said,) = [w for w in t.warnings if "seed" in w]
        assert said.startswith("every frontier point comes from a single seed (1 seed at each")
        assert t.determined


@pytest.mark.parametrize("counts", [[2, 2, 2, 2, 2, 2], [3, 2, 4, 2, 2, 3]])
def test_two_or_more_seeds_everywhere_is_silent(counts: list[int]) -> None:
    report = sweep.analyse(_seed_counts(counts), loss_source="eval")
    assert not [w for t in report.targets for w in t.warnings if "seed" in w]
