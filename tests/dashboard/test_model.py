"""The dashboard's arithmetic is the estimator module's: verdicts, smoothing, B_crit fits."""

from __future__ import annotations

import pandas as pd
import pytest

from noisescope.estimators import examples_ratio, steps_ratio
from noisescope_dashboard import _model

from ._synth import steps_to_reach


def test_verdict_matches_the_issue_example() -> None:
    text = _model.verdict(256, 256 / 0.3)
    assert text == (
        "batch 256 is ~0.3× B_simple: doubling it would cut steps by ~38% for ~23% more examples."
    )


def test_verdict_for_large_batches_and_unmeasurable() -> None:
    text = _model.verdict(4096, 1024, units="tokens")
    saved = 1 - examples_ratio(2048, 1024) / examples_ratio(4096, 1024)
    more = steps_ratio(2048, 1024) / steps_ratio(4096, 1024) - 1
    assert text.startswith("batch 4096 is ~4× B_simple: halving it")
    assert f"~{saved * 100:.0f}% of the tokens" in text
    assert f"~{more * 100:.0f}% more steps" in text
    assert "not yet measurable" in _model.verdict(64, None)


def _buckets(g: list[float], t: list[float]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "step": range(1, len(g) + 1),
            "n": [1] * len(g),
            "sum_g_sq": g,
            "sum_trace_sigma": t,
        }
    )


def test_window_smoothing_takes_the_ratio_of_sums_not_the_mean_of_ratios() -> None:
    # |G|^2 alternates 0.5 / 1.5 (mean 1), tr(Sigma) = 100: ratio of sums is 100 exactly,
    # the mean of per-step ratios would be (200 + 66.7) / 2 = 133.
    out = _model.smooth(_buckets([0.5, 1.5] * 20, [100.0] * 40), method="window", window_steps=10)
    assert out["b_simple"].iloc[-1] == pytest.approx(100.0)
    lo, hi = out["b_simple_lo"].iloc[-1], out["b_simple_hi"].iloc[-1]
    assert lo <= 100.0 <= hi


def test_ema_smoothing_is_debiased_from_the_first_step() -> None:
    out = _model.smooth(_buckets([1.0] * 5, [50.0] * 5), method="ema", beta=0.99)
    assert out["b_simple"].tolist() == pytest.approx([50.0] * 5)


def test_unmeasurable_windows_have_no_b_simple() -> None:
    out = _model.smooth(_buckets([-1.0, -1.0], [10.0, 10.0]), method="window", window_steps=5)
    assert out["b_simple"].isna().all()


def test_critical_batch_fit_recovers_b_crit() -> None:
    sizes = [16.0, 32.0, 64.0, 128.0, 256.0]
    rows = [
        {
            "target": 0.5,
            "run": f"r{b}",
            "batch_size": b,
            "steps": steps_to_reach(0.5, b, 200.0),
            "examples": b * steps_to_reach(0.5, b, 200.0),
        }
        for b in sizes
    ]
    result = _model.critical_batch_analysis(pd.DataFrame(rows), [0.5, 0.05])
    (fit,) = result.fits.itertuples()
    assert fit.b_crit == pytest.approx(200.0, rel=1e-9)
    assert fit.e_min == pytest.approx(fit.s_min * 200.0, rel=1e-9)
    # the unreached target explains itself instead of drawing a curve
    assert len(result.messages) == 1
    assert "loss 0.05" in result.messages[0] and "at least 3" in result.messages[0]
    # the fitted curve lies on S = S_min (1 + B_crit/B)
    curve = result.curves
    assert (curve["steps"] / fit.s_min).tolist() == pytest.approx(
        [steps_ratio(b, 200.0) for b in curve["batch_size"]]
    )


def test_critical_batch_fit_impossible_says_why() -> None:
    rows = pd.DataFrame(
        {
            "target": [1.0] * 3,
            "run": ["a", "b", "c"],
            "batch_size": [16.0, 32.0, 64.0],
            "steps": [10.0, 20.0, 40.0],
            "examples": [160.0, 640.0, 2560.0],
        }
    )
    result = _model.critical_batch_analysis(rows, [1.0])
    assert result.fits.empty
    assert "does not fit" in result.messages[0]


def test_tradeoff_curve_uses_the_model() -> None:
    curve = _model.tradeoff_curve(100.0)
    mid = curve.iloc[(curve["batch_size"] - 100.0).abs().argmin()]
    assert mid["steps_ratio"] == pytest.approx(steps_ratio(mid["batch_size"], 100.0))
    assert mid["examples_ratio"] == pytest.approx(examples_ratio(mid["batch_size"], 100.0))
