"""BatchSizeScheduler on synthetic noise-scale sequences: bounded, monotone, no oscillation."""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

import pytest

from noisescope.estimators import CURRENT_MIN_SAMPLES
from noisescope.schedule import BatchDecision, BatchSizeScheduler


class Events:
    """Collects log_event calls the way a Run would receive them."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str, dict[str, Any]]] = []

    def log_event(self, step: int, kind: str, payload: dict[str, Any] | None = None) -> None:
        self.calls.append((step, kind, dict(payload or {})))


def _sched(**kw: Any) -> BatchSizeScheduler:
    args: dict[str, Any] = {
        "micro_batch_size": 8,
        "min_batch_size": 16,
        "max_batch_size": 1024,
        "warmup_steps": 10,
        "cooldown_steps": 20,
        "hysteresis": 0.5,
    }
    args.update(kw)
    return BatchSizeScheduler(**args)


def _norms(
    rng: random.Random, g_sq: float, trace_sigma: float, b_small: float, b_big: float
) -> tuple[float, float]:
    """Noisy squared norms with E|G_B|^2 = |G|^2 + tr(Sigma)/B (docs/science.md eq. 1)."""
    small = (g_sq + trace_sigma / b_small) * rng.gammavariate(20.0, 1.0 / 20.0)
    big = (g_sq + trace_sigma / b_big) * rng.gammavariate(20.0, 1.0 / 20.0)
    return small, big


def _feed_noisy(
    sched: BatchSizeScheduler, b_simple_of_step: Any, steps: int, seed: int
) -> list[int]:
    """Run ``steps`` measured steps whose true B_simple follows ``b_simple_of_step``."""
    rng = random.Random(seed)
    batches = []
    for step in range(steps):
        g_sq = 1.0
        trace_sigma = b_simple_of_step(step) * g_sq
        b_small, b_big = sched.micro_batch_size, sched.batch_size
        small, big = _norms(rng, g_sq, trace_sigma, b_small, b_big)
        sched.observe_norms(step, b_small, b_big, small, big)
        batches.append(sched.batch_size)
    return batches


def _reversals(batches: list[int]) -> int:
    changes = [b2 - b1 for b1, b2 in itertools.pairwise(batches) if b2 != b1]
    return sum(1 for a, b in itertools.pairwise(changes) if (a > 0) != (b > 0))


def test_rising_sequence_grows_monotonically_within_bounds() -> None:
    sched = _sched()
    seen = []
    for step in range(3000):
        b_simple = 10.0 * math.exp(step / 400.0)  # 10 -> ~18000, past max_batch_size
        sched.update(step, b_simple)
        seen.append(sched.batch_size)
    assert all(b2 >= b1 for b1, b2 in itertools.pairwise(seen))
    assert all(16 <= b <= 1024 for b in seen)
    assert seen[0] == 16
    assert seen[-1] == 1024
    # every change at least ``cooldown_steps`` apart and by at least the hysteresis factor
    steps = [d.step for d in sched.decisions]
    assert all(s2 - s1 >= 20 for s1, s2 in itertools.pairwise(steps))
    for d in sched.decisions[:-1]:  # the last one may be clamped at max_batch_size
        assert d.batch_size >= 1.5 * d.old_batch_size - sched.micro_batch_size
    # bounded number of changes: a factor >= 1.5 each from 16 to 1024
    assert len(sched.decisions) <= math.ceil(math.log(1024 / 16) / math.log(1.5)) + 1


def test_batch_follows_the_target_when_it_moves_by_more_than_the_band() -> None:
    sched = _sched()
    for step in range(100):
        sched.update(step, 200.0)
    assert sched.batch_size == 200  # 25 micro-batches of 8
    for step in range(100, 200):
        sched.update(step, 280.0)  # 1.4x: inside the band, no change
    assert sched.batch_size == 200
    for step in range(200, 300):
        sched.update(step, 320.0)  # 1.6x: outside
    assert sched.batch_size == 320


def test_flat_noisy_measurements_change_the_batch_once_and_never_oscillate() -> None:
    for seed in range(5):
        sched = _sched(allow_shrink=True, warmup_steps=50)  # one EMA horizon, 1/(1 - beta)
        batches = _feed_noisy(sched, lambda step: 300.0, 4000, seed)
        assert _reversals(batches) == 0
        # 16 -> 300 in steps of at most 2x (max_step_factor), then at most one correction
        assert len(sched.decisions) <= 6
        # ended near the true noise scale (EMA of unbiased estimates)
        assert 300 / 1.5 <= sched.batch_size <= 300 * 1.5


def test_noisy_rising_sequence_is_monotone_even_when_shrinking_is_allowed() -> None:
    for seed in range(5):
        sched = _sched(allow_shrink=True, warmup_steps=50)
        batches = _feed_noisy(sched, lambda step: 20.0 * 1.001**step, 4000, seed)  # 20 -> ~1090
        assert _reversals(batches) == 0
        assert all(b2 >= b1 for b1, b2 in itertools.pairwise(batches))
        assert batches[-1] >= 512


def test_falling_noise_scale_shrinks_only_when_allowed() -> None:
    grow_only = _sched()
    both = _sched(allow_shrink=True)
    for s in (grow_only, both):
        for step in range(200):
            s.update(step, 800.0)
        for step in range(200, 600):
            s.update(step, 40.0)
    assert grow_only.batch_size == 800
    # shrinks (by at most 2x per change) until the target is inside the wider shrink band
    assert 40 <= both.batch_size <= 40 * 1.5**2
    assert both.decisions[-1].direction == "shrink"


def test_targets_outside_the_range_clamp_to_the_bounds() -> None:
    sched = _sched(max_batch_size=100)  # 12 whole micro-batches of 8 = 96
    for step in range(100):
        sched.update(step, 1e9)
    assert sched.batch_size == 96 == sched.max_batch_size
    low = _sched(allow_shrink=True)
    for step in range(100):
        low.update(step, 0.5)
    assert low.batch_size == 16
    assert not low.decisions


def test_nothing_changes_during_warmup_or_while_not_measurable() -> None:
    sched = _sched(warmup_steps=50)
    for step in range(50):
        assert sched.update(step, 1000.0) is None
    for step in range(50, 60):
        assert sched.update(step, None) is None
    assert sched.batch_size == 16
    assert sched.update(60, 1000.0) is not None


def test_lr_rules_and_cap() -> None:
    for rule, expected in (("linear", 0.1 * 4), ("sqrt", 0.1 * 2), ("none", 0.1)):
        sched = _sched(base_lr=0.1, lr_rule=rule)
        assert sched.lr == pytest.approx(0.1)
        for step in range(100):
            sched.update(step, 64.0)  # 16 -> 32 -> 64: 4x in two changes
        assert sched.batch_size == 64
        assert sched.lr == pytest.approx(expected)
        assert sched.decisions[0].old_lr == pytest.approx(0.1)
        assert sched.decisions[-1].lr == pytest.approx(expected)
    capped = _sched(base_lr=0.1, lr_rule="linear", max_lr=0.25)
    for step in range(100):
        capped.update(step, 64.0)
    assert capped.lr == pytest.approx(0.25)


def test_each_change_is_logged_as_an_event_with_its_decision() -> None:
    events = Events()
    sched = _sched(run=events, base_lr=0.1)
    for step in range(400):
        sched.update(step, 16.0 * 1.01**step)
    assert len(events.calls) == len(sched.decisions) >= 3
    for (step, kind, payload), decision in zip(events.calls, sched.decisions, strict=True):
        assert kind == "batch_size"
        assert step == decision.step
        assert payload["batch_size"] == decision.batch_size
        assert payload["accum_steps"] * payload["micro_batch_size"] == payload["batch_size"]
        assert BatchDecision(**payload) == decision


def test_a_failing_event_sink_never_reaches_the_training_loop() -> None:
    class Broken:
        def log_event(self, step: int, kind: str, payload: dict[str, Any] | None = None) -> None:
            raise RuntimeError("sink down")

    sched = _sched(run=Broken())
    for step in range(100):
        sched.update(step, 500.0)
    assert sched.batch_size == 496


def test_observe_accepts_probe_samples_and_skips_none() -> None:
    class Sample:
        def __init__(self, step: int, b_small: float, b_big: float, small: float, big: float):
            self.step, self.b_small, self.b_big = step, b_small, b_big
            self.g_small_sq, self.g_big_sq = small, big

    sched = _sched(warmup_steps=0)
    assert sched.observe(None) is None
    # a step with a single batch size (b_small == b_big) is skipped, never raised
    assert sched.observe(Sample(0, 16, 16, 2.0, 2.0)) is None
    assert sched.observe_norms(0, 8, 16, float("nan"), 1.0) is None
    # exact norms: |G|^2 = 1, tr(Sigma) = 400 -> B_simple = 400, once the current window has
    # its fewest samples (the first decision comes with the first measurable window)
    for step in range(CURRENT_MIN_SAMPLES):
        assert sched.noise_scale is None
        decision = sched.observe(Sample(step, 8, 16, 1 + 400 / 8, 1 + 400 / 16))
    assert sched.noise_scale == pytest.approx(400.0)
    assert decision is not None
    assert decision.batch_size == 32
    assert decision.target_batch_size == pytest.approx(400.0)


def test_state_dict_round_trip_continues_identically() -> None:
    a = _sched(base_lr=0.1)
    rng = random.Random(0)
    for step in range(300):
        small, big = _norms(rng, 1.0, 100.0 + step, a.micro_batch_size, a.batch_size)
        a.observe_norms(step, a.micro_batch_size, a.batch_size, small, big)
    b = _sched(base_lr=0.1)
    b.load_state_dict(a.state_dict())
    for step in range(300, 600):
        small, big = _norms(rng, 1.0, 100.0 + step, a.micro_batch_size, a.batch_size)
        da = a.observe_norms(step, a.micro_batch_size, a.batch_size, small, big)
        db = b.observe_norms(step, b.micro_batch_size, b.batch_size, small, big)
        assert da == db
    assert a.batch_size == b.batch_size
    assert a.decisions == b.decisions


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"micro_batch_size": 0}, "micro_batch_size"),
        ({"min_batch_size": 4}, "at least micro_batch_size"),
        ({"max_batch_size": 8}, "max_batch_size"),
        ({"lr_rule": "cubic"}, "lr_rule"),
        ({"hysteresis": -1}, "hysteresis"),
        ({"max_step_factor": 1.2}, "max_step_factor"),
        ({"base_lr": 0.0}, "base_lr"),
        ({"target_ratio": 0}, "target_ratio"),
    ],
)
def test_bad_arguments_say_what_to_fix(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _sched(**kwargs)


def test_the_noise_rule_is_the_best_sgd_step_at_the_current_noise_scale() -> None:
    """ε = ε_max/(1 + B_simple/B) (estimators.noise_scaled_lr); before the first measurement
    the tuned base lr, linear in B and capped."""
    sched = _sched(base_lr=0.1, max_lr=0.8, max_batch_size=64, lr_rule="noise")
    assert sched.lr == pytest.approx(0.1)  # nothing measured yet: base_lr at the base batch
    for step in range(100):
        sched.update(step, 64.0)  # 16 -> 32 -> 64
    assert sched.batch_size == 64
    assert sched.lr == pytest.approx(0.8 / (1.0 + 64.0 / 64.0))
    sched.update(100, 192.0)  # the noise scale grows: at the same batch the step shrinks
    assert sched.batch_size == 64  # at its maximum
    assert sched.lr == pytest.approx(0.8 / (1.0 + 192.0 / 64.0))
    no_base = _sched(max_lr=0.8, lr_rule="noise")
    assert no_base.lr == pytest.approx(0.4)  # no base lr, nothing measured: B taken at B_noise
    assert _sched(base_lr=0.1, max_lr=0.8).lr_rule == "linear"  # the default


def test_the_sqrt_policy_asks_for_the_geometric_mean_of_b_simple_and_b_ref() -> None:
    sched = _sched(policy="sqrt", reference_batch_size=64.0, max_step_factor=64.0)
    assert sched.target_for(4096.0) == pytest.approx(512.0)
    for step in range(100):
        sched.update(step, 4096.0)
    assert sched.batch_size == 512
    assert sched.decisions[-1].target_batch_size == pytest.approx(512.0)
    default = _sched(policy="sqrt")  # B_ref = √(min · max) = √(16 · 1024)
    assert default.reference_batch_size == pytest.approx(128.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lr_rule": "noise"}, "needs max_lr"),
        ({"policy": "cubic"}, "policy"),
        ({"policy": "sqrt", "reference_batch_size": 0.0}, "reference_batch_size"),
    ],
)
def test_bad_policy_arguments_say_what_to_fix(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _sched(**kwargs)
