"""The critical batch size from sweeps whose answer is known (harness/synthetic_sweep.py):
the frontier, the fit and its interval, B_simple at the same loss, default targets, warnings."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from harness.synthetic_sweep import make_sweep, steps_to, to_sweep_runs
from noisescope import sweep

BATCHES = (16, 32, 64, 128, 256, 512, 1024)


def test_the_frontier_takes_the_fastest_learning_rate_per_batch_size() -> None:
    runs = to_sweep_runs(make_sweep(200.0, BATCHES))
    report = sweep.analyse(runs, [1.5], loss_source="eval")
    (target,) = report.targets
    assert [p.batch_size for p in target.points] == list(BATCHES)
    assert {p.lr for p in target.points} == {0.3}  # q = 1: the best learning rate everywhere
    for p in target.points:  # steps from the evaluation curve, to its interpolation error
        assert p.steps == pytest.approx(steps_to(1.5, p.batch_size, 200.0), rel=0.02)
        assert p.examples == pytest.approx(p.steps * p.batch_size)
    used = {r.uid for r in target.runs if r.frontier}
    assert used == {uid for p in target.points for uid in p.run_uids}
    assert len(target.runs) == len(runs)


@pytest.mark.parametrize("b_crit", [50.0, 200.0, 700.0])
def test_b_crit_is_recovered_within_ten_percent_at_every_default_target(b_crit: float) -> None:
    runs = to_sweep_runs(
        make_sweep(b_crit, BATCHES, seeds=3, seed_spread=0.05, rng=random.Random(int(b_crit)))
    )
    report = sweep.analyse(runs, loss_source="eval")
    assert report.default_targets
    assert len(report.targets) == len(sweep.DEFAULT_TARGET_FRACTIONS)
    for t in report.targets:
        assert t.determined, t.warnings
        assert t.b_crit == pytest.approx(b_crit, rel=0.10)
        assert t.b_crit_lo is not None and t.b_crit_hi is not None
        assert t.b_crit is not None
        assert t.b_crit_lo <= t.b_crit <= t.b_crit_hi
        assert len(t.points) == len(BATCHES)  # every batch size reaches every default target
        # B_simple at the same loss, from the same (frontier) runs: b_crit / 2 by construction
        assert t.b_simple == pytest.approx(b_crit / 2, rel=1e-9)
        assert t.b_simple is not None and t.b_simple_hi is not None
        assert t.b_simple_lo is not None and t.b_simple_lo <= t.b_simple <= t.b_simple_hi
        steps = {c.batch_size: c.steps for c in t.curve}
        assert len(t.curve) == sweep.CURVE_POINTS
        for b, s in list(steps.items())[::10]:
            assert t.s_min is not None
            assert s == pytest.approx(t.s_min * (1 + t.b_crit / b))


def test_the_interval_covers_the_truth_at_its_level_under_seed_noise() -> None:
    """Over many noisy sweeps the 90% interval holds the true B_crit about 90% of the time."""
    rng = random.Random(7)
    covered = total = 0
    for _ in range(200):
        runs = to_sweep_runs(make_sweep(200.0, BATCHES, seed_spread=0.15, rng=rng), noise=False)
        (t,) = sweep.analyse(runs, [1.2], loss_source="eval").targets
        if t.b_crit_lo is None or t.b_crit_hi is None:
            covered += 1  # an unbounded interval covers everything
        else:
            covered += t.b_crit_lo <= 200.0 <= t.b_crit_hi
        total += 1
    assert 0.82 <= covered / total <= 0.97


def test_too_few_batch_sizes_reaching_a_target_is_a_warning_not_a_number() -> None:
    runs = to_sweep_runs(make_sweep(200.0, (16, 256, 1024), final_loss=1.5))
    (t,) = sweep.analyse([r for r in runs if r.batch_size != 16], [1.6], loss_source="eval").targets
    assert not t.determined
    assert t.b_crit is None
    assert any("a fit needs at least 3" in w for w in t.warnings)


def test_a_target_some_batch_sizes_never_reach_says_which() -> None:
    # The runs at the largest batch stop (loss 1.5) before a target of 1.2 that the others reach.
    runs = to_sweep_runs(make_sweep(200.0, BATCHES[:-1], final_loss=1.1))
    runs += to_sweep_runs(make_sweep(200.0, BATCHES[-1:], final_loss=1.5))
    (t,) = sweep.analyse(runs, [1.2], loss_source="eval").targets
    assert [p.batch_size for p in t.points] == list(BATCHES[:-1])
    (warning,) = [w for w in t.warnings if "not reached at batch size" in w]
    assert "1,024" in warning and f"other {len(BATCHES) - 1} batch sizes" in warning
    assert t.determined and t.b_crit == pytest.approx(200.0, rel=0.10)  # the fit still stands


def test_batch_sizes_all_far_below_b_crit_cannot_locate_it() -> None:
    """S ∝ 1/B throughout: the fitted S_min is ~0 and B_crit is not determined."""
    runs = to_sweep_runs(make_sweep(1e6, (8, 16, 32, 64), rng=random.Random(3)))
    for t in sweep.analyse(runs, loss_source="eval").targets:
        assert not t.determined
        assert t.warnings


def test_batch_sizes_all_above_b_crit_flag_an_extrapolation() -> None:
    runs = to_sweep_runs(make_sweep(4.0, (256, 512, 1024, 2048), seed_spread=0.0))
    for t in sweep.analyse(runs, loss_source="eval").targets:
        assert not t.determined
        assert any("outside the batch sizes" in w or "not" in w for w in t.warnings)


def test_a_target_every_run_starts_below_is_not_measured() -> None:
    runs = to_sweep_runs(make_sweep(200.0, BATCHES))
    (t,) = sweep.analyse(runs, [10.0], loss_source="eval").targets
    assert not t.determined
    assert not t.points
    assert any("start at or below" in w for w in t.warnings)


def test_seeds_count_by_their_median_and_a_seed_that_never_arrives_is_infinitely_slow() -> None:
    def run(uid: str, lr: float, crossing: float | None) -> sweep.SweepRun:
        steps = [0.0, 1000.0]
        losses = [2.0, 2.0] if crossing is None else [2.0, 2.0 - 1000.0 / crossing]
        return sweep.SweepRun(uid, uid, 64.0, lr, steps, losses)

    # lr 0.1: seeds reach loss 1.0 at 100, 200 and 300 steps (median 200)
    # lr 0.3: two of three seeds never reach it (median: never), despite one at 50 steps
    runs = [run("a", 0.1, 100), run("b", 0.1, 200), run("c", 0.1, 300)]
    runs += [run("d", 0.3, 50), run("e", 0.3, None), run("f", 0.3, None)]
    points, crossing = sweep.frontier(runs, 1.0)
    assert [(p.lr, p.run_uids) for p in points] == [(0.1, ["a", "b", "c"])]
    assert points[0].steps == pytest.approx(200.0)
    assert crossing["e"] is None


def test_default_targets_are_reached_by_every_batch_size_and_leave_out_stalled_ones() -> None:
    runs = to_sweep_runs(make_sweep(200.0, BATCHES))
    stalled = sweep.SweepRun("x", "stalled", 4096.0, 0.1, [0.0, 10.0], [3.5, 3.4])
    targets, warnings = sweep.default_targets([*runs, stalled])
    assert any("4,096" in w for w in warnings)
    best: dict[float, float] = {}
    for r in runs:
        best[r.batch_size] = min(best.get(r.batch_size, math.inf), min(r.losses))
    assert min(targets) > max(best.values())
    assert max(targets) < min(r.losses[0] for r in runs)


def _line(uid: str, batch_size: float, final: float, steps: int = 100) -> sweep.SweepRun:
    """A run at learning rate 0.1 whose loss falls linearly from 3 to ``final``."""
    xs = [float(s) for s in range(1, steps + 1)]
    losses = [3.0 - (3.0 - final) * (s - 1) / (steps - 1) for s in xs]
    return sweep.SweepRun(uid, uid, batch_size, 0.1, xs, losses)


def test_default_targets_are_reached_by_the_median_seed_of_every_batch_size() -> None:
    # At batch size 128 one lucky seed of three gets to 1.0, the other two stop at 2.0: the
    # frontier takes the median seed, so a target below 2.0 is not reached at 128.
    runs = [_line(f"{b}", b, 1.5) for b in (32.0, 64.0)]
    runs += [_line("lucky", 128.0, 1.0), _line("s1", 128.0, 2.0), _line("s2", 128.0, 2.0)]
    targets, _ = sweep.default_targets(runs)
    assert min(targets) > 2.0
    for t in sweep.analyse(runs, loss_source="eval").targets:
        assert [p.batch_size for p in t.points] == [32.0, 64.0, 128.0], t.target


def test_default_targets_ignore_the_noise_at_the_end_of_a_training_loss() -> None:
    # The smoothed training loss at a run's last step is that step's raw loss: a dip there is
    # noise, and a target set from it is "reached" only by that one step.
    runs = [_line(f"{b}", b, 1.5) for b in (32.0, 64.0)] + [_line("dip", 128.0, 2.0)]
    dip = runs[-1]
    raw = [*dip.losses[:-1], 0.5]
    runs[-1] = sweep.SweepRun("dip", "dip", 128.0, 0.1, dip.steps, sweep.smooth_training_loss(
        dip.steps, raw
    ))  # fmt: skip
    targets, _ = sweep.default_targets(runs, "train")
    assert min(targets) > 2.0
    for t in sweep.analyse(runs, loss_source="train").targets:
        (at_128,) = [r for r in t.runs if r.batch_size == 128.0]
        assert at_128.steps is not None and at_128.steps < dip.steps[-1] / (1 + sweep.LOSS_WINDOW)


def test_smoothing_the_training_loss_is_centred_and_symmetric_at_the_ends() -> None:
    steps = [float(s) for s in range(1, 201)]
    line = [10.0 - 0.01 * s for s in steps]  # linear: a centred mean is exact, ends included
    smoothed = sweep.smooth_training_loss(steps, line)
    assert smoothed == pytest.approx(line)
    assert smoothed[-1] == line[-1]  # the last point has no future: its window is itself
    noisy = [v + (0.5 if i % 2 else -0.5) for i, v in enumerate(line)]
    inner = list(zip(sweep.smooth_training_loss(steps, noisy), line, strict=True))[20:180]
    assert max(abs(a - b) for a, b in inner) < 0.1  # +-0.5 alternating, averaged away


def test_crossing_step_interpolates_between_points() -> None:
    assert sweep.crossing_step([0, 10, 20], [3.0, 2.0, 1.0], 1.5) == pytest.approx(15.0)
    assert sweep.crossing_step([0, 10], [3.0, 2.0], 1.0) is None
    assert sweep.crossing_step([5, 10], [1.0, 0.5], 2.0) == 5.0


def test_a_target_is_a_point_of_b_simple_against_b_crit_only_when_both_are_known() -> None:
    t = sweep.TargetResult(
        target=1.2,
        points=[],
        runs=[],
        s_min=50.0,
        e_min=1e4,
        b_crit=200.0,
        b_crit_lo=150.0,
        b_crit_hi=260.0,
        determined=True,
        warnings=[],
        b_simple=120.0,
        b_simple_lo=100.0,
        b_simple_hi=None,
        b_simple_reason=None,
    )
    assert t.b_simple_vs_b_crit() == {
        "target": 1.2,
        "b_crit": 200.0,
        "b_crit_lo": 150.0,
        "b_crit_hi": 260.0,
        "b_simple": 120.0,
        "b_simple_lo": 100.0,
        "b_simple_hi": None,
    }
    assert dataclasses.replace(t, determined=False).b_simple_vs_b_crit() is None
    assert dataclasses.replace(t, b_crit=None).b_simple_vs_b_crit() is None
    assert dataclasses.replace(t, b_simple=None).b_simple_vs_b_crit() is None
