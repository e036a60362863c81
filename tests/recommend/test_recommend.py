"""Recommendations against hand-computed values of docs/science.md eq. 7 and Pollux's goodput."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from noisescope.estimators import (
    Interval,
    NoiseScale,
    NoiseScaleInterval,
    goodput,
    goodput_optimal_batch,
    interpolate_throughput,
    scaled_lr,
    statistical_efficiency,
)
from noisescope.recommend import (
    MAX_DEVICES,
    NoiseTracker,
    default_candidates,
    parallelism_plan,
    recommend,
    verdict,
)


def test_efficiency_is_pollux_and_the_examples_ratio_of_the_s_e_model() -> None:
    # phi = 100, B = 50, B0 = 25: (100 + 25) / (100 + 50)
    assert statistical_efficiency(50, 100, 25) == pytest.approx(125 / 150)
    # B0 = 0: E_min / E = 1 / (1 + B / B_crit) = 1 / 1.5
    assert statistical_efficiency(50, 100) == pytest.approx(1 / 1.5)
    assert statistical_efficiency(25, 100, 25) == 1.0
    assert goodput(3000, 128, 100) == pytest.approx(3000 * 100 / 228)


def test_recommendation_matches_hand_computed_values() -> None:
    noise = NoiseScaleInterval(
        level=0.9,
        n=500,
        n_blocks=20,
        g_sq=None,
        trace_sigma=None,
        b_simple=Interval(100.0, 80.0, 130.0),
    )
    rec = recommend(noise, 50, candidates=[25, 100, 400])
    assert (rec.b_simple, rec.b_simple_lo, rec.b_simple_hi, rec.level) == (100.0, 80.0, 130.0, 0.9)
    cur = rec.current
    assert cur is not None
    # S/S_min = 1 + B_crit/B = 1 + 100/50; E/E_min = 1 + B/B_crit = 1 + 50/100
    assert cur.steps_ratio == pytest.approx(3.0)
    assert cur.examples_ratio == pytest.approx(1.5)
    assert cur.efficiency == pytest.approx(100 / 150)
    by_b = {o.batch_size: o for o in rec.options}
    assert sorted(by_b) == [25, 100, 400]
    assert by_b[25].steps_ratio == pytest.approx(5.0)
    assert by_b[25].examples_ratio == 1.25
    # at B = B_crit: twice the minimum steps and twice the minimum examples
    assert by_b[100].steps_ratio == pytest.approx(2.0)
    assert by_b[100].examples_ratio == 2.0
    assert by_b[400].steps_ratio == pytest.approx(1.25)
    assert by_b[400].examples_ratio == 5.0
    assert rec.critical_batch_size == 100.0
    assert rec.goodput_batch_size is None  # no throughput given
    assert rec.summary() == "B_simple 100 [80, 130]; batch 50: 3× min steps, 1.5× min examples"


def test_a_tight_interval_reads_as_two_ends_apart_from_the_ratio() -> None:
    # B / B_simple = 64/100 with ends 64/100.5 and 64/99.5: at two digits all three read 0.64
    text = verdict(64, 100.0, lo=99.5, hi=100.5, level=0.9)
    assert text == (
        "batch 64 is ~0.64× B_simple (90% interval 0.637× to 0.643×): near the balance point, "
        "at ~2.6× the minimum steps and ~1.6× the minimum examples."
    )


def test_goodput_optimal_batch_from_measured_throughput() -> None:
    throughput: dict[float, float] = {32: 1000.0, 64: 1800.0, 128: 3000.0, 256: 4000.0}
    rec = recommend(100.0, 64, throughput=throughput, candidates=[96])
    goodputs = {32: 1000 * 100 / 132, 64: 1800 * 100 / 164, 128: 3000 * 100 / 228}
    goodputs[256] = 4000 * 100 / 356
    # 96 lies between 64 and 128: throughput linear in log-log
    t96 = math.exp(math.log(1800) + math.log(1.5) / math.log(2) * math.log(3000 / 1800))
    goodputs[96] = t96 * 100 / 196
    by_b = {o.batch_size: o for o in rec.options}
    for b, g in goodputs.items():
        assert by_b[b].goodput == pytest.approx(g)
    assert rec.goodput_batch_size == max(goodputs, key=lambda b: goodputs[b]) == 128
    best_b, best_g = goodput_optimal_batch(list(throughput), list(throughput.values()), 100.0)
    assert best_b == 128
    assert best_g == pytest.approx(goodputs[128])
    # a much larger noise scale makes big batches efficient: the argmax moves to 256
    assert recommend(10_000.0, 64, throughput=throughput).goodput_batch_size == 256
    assert interpolate_throughput([32, 64], [1.0, 2.0], 512) is None  # no extrapolation


def test_not_measurable_gives_a_reason_and_no_numbers() -> None:
    rec = recommend(NoiseScale.from_means(-1.0, 5.0, 100), 64)
    assert rec.b_simple is None
    assert rec.current is None
    assert rec.options == ()
    assert rec.reason is not None
    assert "not yet measurable" in rec.reason
    assert "not yet measurable" in rec.summary()
    assert recommend(None, 64).reason is not None


def test_default_candidates_bracket_the_batch_and_the_noise_scale() -> None:
    cands = default_candidates(64, 1000)
    assert cands[0] <= 8
    assert cands[-1] >= 8000
    assert all(b2 == 2 * b1 for b1, b2 in itertools.pairwise(cands))


def test_scaled_lr_rules() -> None:
    assert scaled_lr(0.1, 400, 100, "linear") == pytest.approx(0.4)
    assert scaled_lr(0.1, 400, 100, "sqrt") == pytest.approx(0.2)
    assert scaled_lr(0.1, 400, 100, "none") == pytest.approx(0.1)
    with pytest.raises(ValueError, match="lr rule"):
        scaled_lr(0.1, 400, 100, "cubic")


def test_bad_inputs_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="positive"):
        recommend(100.0, 64, throughput={64: -1.0})
    with pytest.raises(ValueError, match="batch_size"):
        recommend(100.0, 0)
    # not finite: no verdict, candidate or goodput is built on inf or nan
    inf, nan = math.inf, math.nan
    for kwargs, named in (
        ({"batch_size": inf}, "batch_size"),
        ({"batch_size": nan}, "batch_size"),
        ({"candidates": [64.0, inf]}, "candidates"),
        ({"throughput": {64.0: nan}}, "throughput must"),
        ({"throughput": {inf: 1.0}}, "throughput batch size"),
        ({"reference_batch": inf}, "reference_batch"),
        ({"reference_batch": -1.0}, "reference_batch"),
    ):
        args: dict[str, Any] = {"batch_size": 64.0, **kwargs}
        with pytest.raises(ValueError, match=named):
            recommend(100.0, **args)


class Collect:
    def __init__(self) -> None:
        self.rows: list[tuple[object, ...]] = []

    def log_sample(self, *args: object, **kw: object) -> None:
        self.rows.append((*args, kw.get("series", "")))


def test_tracker_forwards_every_sample_and_recovers_b_simple() -> None:
    sink = Collect()
    tracker = NoiseTracker(sink)
    # exact norms from eq. 1: |G|^2 = 2, tr(Sigma) = 300 -> B_simple = 150, with a small
    # deterministic wobble so the window has a spread
    for step in range(200):
        wobble = 1.0 + 0.01 * math.sin(step)
        small = (2.0 + 300.0 / 8) * wobble
        big = (2.0 + 300.0 / 32) * wobble
        tracker.log_sample(step, 8, 32, small, big, loss=1.0)
        tracker.log_sample(step, 8, 32, 1.0, 0.5, series="layer0")
    assert len(sink.rows) == 400  # forwarded, both series
    rec = tracker.recommendation(candidates=[150])
    assert rec.batch_size == 32  # the last b_big seen
    assert rec.b_simple == pytest.approx(150.0, rel=0.02)
    assert rec.b_simple_lo is not None
    assert rec.b_simple_hi is not None
    assert rec.b_simple_lo <= 150.0 * 1.02
    assert rec.b_simple_hi >= 150.0 * 0.98
    assert tracker.current().b_simple == rec.b_simple  # the window the recommendation used
    assert rec.options[0].steps_ratio == pytest.approx(2.0, rel=0.02)


_sizes = st.floats(min_value=5e-324, max_value=1.7976931348623157e308) | st.sampled_from(
    [5e-324, 1e-300, 1e-6, 1.0, 1e18, 1e300]
)


@settings(max_examples=300, deadline=None)
@given(
    b_crit=_sizes,
    per_device=_sizes,
    min_speedup=st.floats(min_value=1.0, max_value=2.0, exclude_min=True, exclude_max=True),
    batch_size=st.none() | _sizes,
    s_min=st.none() | _sizes,
)
def test_a_plan_for_any_positive_inputs_is_an_answer(
    b_crit: float,
    per_device: float,
    min_speedup: float,
    batch_size: float | None,
    s_min: float | None,
) -> None:
    """Issue 29 items 6-7: the derived max_devices overflowed (an infinite device count) or
    was refused as if the caller had given it; it is capped at 2^24 and the plan says so."""
    plan = parallelism_plan(
        b_crit, per_device, min_speedup=min_speedup, batch_size=batch_size, s_min=s_min
    )
    assert 1 <= plan.rows[-1].devices <= MAX_DEVICES
    assert (plan.rows[-1].devices == MAX_DEVICES) or plan.device_limit * 4 < MAX_DEVICES
    if not plan.device_limit < MAX_DEVICES:
        assert "beyond 2^24" in plan.summary
    # one rule for the rows, the summary and the pages: the rows past the limit are the
    # rows after the last one every doubling to which paid (in the API's ranges, where every
    # row's arithmetic is exact enough: no subnormals, no overflow)
    if not all(1e-6 <= value <= 1e18 for value in (b_crit, per_device)):
        return
    past = [r.past_limit for r in plan.rows]
    assert past == sorted(past)
    assert [r.devices for r in plan.rows if not r.past_limit][-1] == min(
        plan.paying_devices, plan.rows[-1].devices
    )


@pytest.mark.parametrize(
    ("b_crit", "per_device", "paying"), [(100.0, 16.0, 4), (2000.0, 32.0, 32), (196.0, 16.0, 8)]
)
def test_the_summary_names_the_last_row_whose_doubling_paid(
    b_crit: float, per_device: float, paying: int
) -> None:
    """Issue 30: "Past ~3 devices" beside a 4-device row whose doubling gave 1.6x (and greyed
    on the chart). The summary, the rows and the pages now read the same device count."""
    plan = parallelism_plan(b_crit, per_device)
    assert plan.paying_devices == paying
    rows = {r.devices: r for r in plan.rows}
    last, beyond = rows[paying].doubling_speedup, rows[2 * paying].doubling_speedup
    assert last is not None and beyond is not None and last >= 1.5 > beyond
    assert not rows[paying].past_limit and rows[2 * paying].past_limit
    assert plan.summary.startswith(
        f"Past {paying} devices ({paying * per_device:,.0f} examples per step) each doubling"
    )
