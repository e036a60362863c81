"""noisescope.branch: the local critical batch size by branching, against closed-form truth."""

from __future__ import annotations

import copy
import itertools
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from examples.branching import DigitsTrainer
from harness.lsq_branch import DiesAfter, Killed, NoisyLeastSquares
from noisescope import branch
from noisescope.estimators import local_critical_batch


def _parent(steps: int) -> NoisyLeastSquares:
    task = NoisyLeastSquares()
    task.sgd(8, 0.2, steps, np.random.default_rng(1))
    return task


@pytest.mark.parametrize(
    ("parent_steps", "lr", "lr_rule", "bracketed"),
    [(50, 0.3, "constant", True), (1500, 0.05, "linear", False)],
)
def test_lsq_branch_measurement_within_1_5x_of_the_closed_form(
    tmp_path: Path, parent_steps: int, lr: float, lr_rule: str, bracketed: bool
) -> None:
    """At step 50 the sampled losses are flat from 8 to 16 and then rise by ~8 ε in one
    doubling: the grid does not resolve the crossing, and the bracket holds the exact one."""
    task = _parent(parent_steps)
    plan = branch.plan(
        step=parent_steps,
        batch_size=4,
        lr=lr,
        multipliers=(1, 2, 4, 8, 16, 32, 64),
        budget=4096,
        lr_rule=lr_rule,
        seeds=4,
        epsilon=0.02,
    )
    exact = task.exact_local(plan)
    result = branch.run(plan, task, tmp_path)
    assert exact.b_crit is not None and result.local is not None
    local = result.local
    lo, hi = local.b_crit_lo, local.b_crit_hi
    assert lo is not None and hi is not None
    assert local.bracketed == bracketed
    if bracketed:
        assert lo <= exact.b_crit <= hi
    else:
        measured = local.b_crit
        assert measured is not None and exact.b_crit / 1.5 <= measured <= exact.b_crit * 1.5
        assert lo <= measured <= hi
        # never narrower than the grid cell around the crossing
        assert lo <= max(b for b in local.batch_sizes if b <= measured)
        assert hi >= min(b for b in local.batch_sizes if b > measured)
    assert not result.missing and len(result.results) == 7 * 4


def _plan(**kw: Any) -> branch.BranchPlan:
    args: dict[str, Any] = {
        "step": 50,
        "batch_size": 4,
        "lr": 0.3,
        "multipliers": (1, 4, 16, 64),
        "budget": 2048,
        "lr_rule": "constant",
        "seeds": 3,
        "epsilon": 0.02,
    }
    args.update(kw)
    return branch.plan(**args)


def test_a_killed_sweep_resumes_without_redoing_finished_branches(tmp_path: Path) -> None:
    plan = _plan()
    first = DiesAfter(5)
    first.sgd(8, 0.2, 50, np.random.default_rng(1))
    parent_w = first.w.copy()
    with pytest.raises(Killed):
        branch.run(plan, first, tmp_path / "sweep")
    assert np.array_equal(first.w, parent_w)  # even a killed sweep leaves the parent as it was
    assert len(branch.BranchStore(tmp_path / "sweep").results()) == 5

    second = _parent(50)
    resumed = branch.run(plan, second, tmp_path / "sweep")
    keys = [b.key for b in plan.branches]
    assert second.trained == keys[5:]
    assert resumed.reused == 5

    fresh = branch.run(plan, _parent(50), tmp_path / "fresh")
    assert resumed.local == fresh.local
    assert resumed.local is not None and resumed.local.b_crit_lo is not None


def test_a_different_plan_in_the_same_store_is_refused(tmp_path: Path) -> None:
    branch.run(_plan(), _parent(50), tmp_path)
    with pytest.raises(ValueError, match="different plan"):
        branch.run(_plan(epsilon=0.05), _parent(50), tmp_path)


def test_a_scheduler_runs_the_plan_in_parallel_and_collects(tmp_path: Path) -> None:
    plan = _plan()
    shipped = branch.BranchPlan.from_json(plan.to_json())
    assert shipped == plan
    assert branch.collect(shipped, tmp_path).local is None  # nothing in yet
    for b in reversed(shipped.branches):  # each job: its own process, restored from a checkpoint
        branch.run_one(shipped, b.key, _parent(50), tmp_path)
    partial = branch.collect(shipped, tmp_path)
    assert not partial.missing
    sequential = branch.run(plan, _parent(50), tmp_path / "seq")
    assert partial.local == sequential.local


class _TorchTrainer(DigitsTrainer):
    """docs/branching.md's example trainer with Adam instead of plain SGD: the optimizer state
    that must survive the branches is non-trivial."""

    def __init__(self) -> None:
        super().__init__(seed=0)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-2)  # type: ignore[assignment]


def _continue(t: _TorchTrainer, steps: int) -> None:
    gen = torch.Generator().manual_seed(99)
    for _ in range(steps):
        t.step(torch.randint(0, 256, (16,), generator=gen), 1e-2)


def test_branching_never_changes_the_parent_state(tmp_path: Path) -> None:
    parent, twin = _TorchTrainer(), _TorchTrainer()
    _continue(parent, 20)
    _continue(twin, 20)
    before = copy.deepcopy((parent.model.state_dict(), parent.opt.state_dict()))
    plan = branch.plan(step=20, batch_size=8, lr=1e-2, budget=256, lr_rule="sqrt", seeds=2)
    result = branch.run(plan, parent, tmp_path)
    assert result.local is not None and not result.notes
    for name, value in before[0].items():
        assert torch.equal(parent.model.state_dict()[name], value), name
    opt_after = parent.opt.state_dict()
    assert opt_after["param_groups"] == before[1]["param_groups"]
    for key, state in before[1]["state"].items():
        for field, value in state.items():
            assert torch.equal(opt_after["state"][key][field], value), (key, field)
    # and the parent run goes on exactly as if it had never branched
    _continue(parent, 5)
    _continue(twin, 5)
    for p, q in zip(parent.model.parameters(), twin.model.parameters(), strict=True):
        assert torch.equal(p, q)


class _NoCopySave(NoisyLeastSquares):
    """save() hands out the live parameter array, and training updates it in place."""

    def save(self) -> Any:
        return self.w

    def restore(self, state: Any) -> None:
        self.w = state

    def train(self, b: branch.Branch, run: object | None) -> None:
        live = self.w
        super().train(b, run)
        live[:] = self.w


def test_a_save_that_does_not_copy_is_reported(tmp_path: Path) -> None:
    task = _NoCopySave()
    task.sgd(8, 0.2, 50, np.random.default_rng(1))
    with pytest.warns(UserWarning, match="save\\(\\) copies"):
        result = branch.run(_plan(), task, tmp_path)
    assert result.notes


# --- the estimator ------------------------------------------------------------------------


def test_local_critical_batch_interpolates_the_crossing_in_log_batch() -> None:
    # D(b) = L(b) - 1.01 L(b0) is -0.01 at 4 and 8, +0.01 at 16 (L(b0) = 1): the crossing is
    # halfway between 8 and 16 in log b.
    est = local_critical_batch([4, 8, 16], [[1.0], [1.0], [1.02]], epsilon=0.01)
    assert est.b_crit == pytest.approx(math.sqrt(8 * 16))
    assert est.b_crit_lo is None and est.reason is not None and "one seed" in est.reason


def test_local_critical_batch_above_the_largest_batch_is_a_lower_bound() -> None:
    est = local_critical_batch([4, 8], [[1.0, 1.1], [1.0, 1.1]], epsilon=0.05)
    assert est.b_crit is None and est.b_crit_lo == 8
    assert est.reason is not None and "larger multipliers" in est.reason


def test_local_critical_batch_interval_over_paired_seeds() -> None:
    base = [1.0, 1.2, 0.9]
    losses = [base, [v * 1.005 for v in base], [v * 1.03 for v in base], [v * 1.2 for v in base]]
    noisy = [[v + 1e-3 * (j - 1) * i for j, v in enumerate(row)] for i, row in enumerate(losses)]
    est = local_critical_batch([1, 2, 4, 8], noisy, epsilon=0.01)
    assert est.b_crit is not None and est.b_crit_lo is not None and est.b_crit_hi is not None
    # the crossing lies between 2 and 4; the interval is at least that grid cell
    assert 2 < est.b_crit < 4 and est.b_crit_lo <= 2 and 4 <= est.b_crit_hi < 8
    diverged = local_critical_batch([1, 2, 4], [base, base, [math.inf] * 3], epsilon=0.01)
    assert diverged.bracketed and (diverged.b_crit_lo, diverged.b_crit_hi) == (2.0, 4.0)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"budget": 100}, "multiple of every branch's batch size"),
        ({"multipliers": (1, 1, 2)}, "distinct"),
        ({"lr_rule": "cubic"}, "lr_rule"),
        ({"epsilon": 0.0}, "epsilon"),
        ({"seeds": 0}, "seeds"),
        ({"lr": float("nan")}, "lr must be"),
    ],
)
def test_bad_plans_say_what_to_fix(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _plan(**kw)


def test_bad_losses_say_what_to_fix() -> None:
    with pytest.raises(ValueError, match="reference"):
        local_critical_batch([1, 2], [[math.nan], [1.0]])
    with pytest.raises(ValueError, match="distinct"):
        local_critical_batch([1, 1], [[1.0], [1.0]])


def test_every_branches_at_its_steps_only(tmp_path: Path) -> None:
    task = _parent(0)
    every = branch.Every(
        20, task, tmp_path, first=10, multipliers=(1, 4), budget=64, seeds=2, lr_rule="constant"
    )
    got = [every(s, batch_size=4, lr=0.1) is not None for s in range(0, 55)]
    assert [s for s, hit in enumerate(got) if hit] == [10, 30, 50]
    assert [r.plan.step for r in every.sweeps] == [10, 30, 50]
    assert all(r.local is not None for r in every.sweeps)
    with pytest.raises(ValueError, match="every"):
        branch.Every(0, task, tmp_path)


def test_the_batch_size_scheduler_follows_the_branch_measurement(tmp_path: Path) -> None:
    """docs/branching.md: scheduler.update(step, local B_crit) makes a batch-size warm-up."""
    from noisescope.schedule import BatchSizeScheduler

    task = _parent(1500)  # a crossing the grid resolves (the step-50 one is a bracket)
    sched = BatchSizeScheduler(
        4, min_batch_size=4, max_batch_size=256, warmup_steps=0, cooldown_steps=0
    )
    every = branch.Every(
        1500,
        task,
        tmp_path,
        multipliers=(1, 2, 4, 8, 16, 32, 64),
        budget=4096,
        seeds=4,
        lr_rule="linear",
        epsilon=0.02,
    )
    result = every(1500, batch_size=sched.batch_size, lr=0.05)
    assert result is not None and result.local is not None and result.local.b_crit is not None
    sizes = [sched.batch_size]
    for step in range(1500, 1506):
        sched.update(step, result.local.b_crit)
        sizes.append(sched.batch_size)
    # it doubles at most per change and settles within its hysteresis band of the measurement
    assert all(b2 <= 2 * b1 for b1, b2 in itertools.pairwise(sizes))
    assert result.local.b_crit / 1.5 <= sizes[-1] <= result.local.b_crit * 1.5
    assert sched.decisions and sched.decisions[-1].noise_scale == result.local.b_crit
