"""The dashboard's reads on a real SQLite file: bucketed in SQL, exact sums, known B_simple."""

from __future__ import annotations

import math

import pytest

from noisescope_dashboard import _data, _model

from ._synth import DIGITS_B_SIMPLE, DIGITS_BATCHES, LM_LAYERS


def test_list_runs_reports_the_known_current_b_simple(synth_db: str) -> None:
    runs = _data.list_runs(synth_db).set_index("name")
    for b in DIGITS_BATCHES:
        row = runs.loc[f"digits-b{b}"]
        assert row["b_simple"] == pytest.approx(DIGITS_B_SIMPLE, rel=1e-9)
        assert row["b_simple_lo"] < DIGITS_B_SIMPLE < row["b_simple_hi"]
        assert row["batch_in_use"] == b
        assert row["last_step"] == 600
    assert set(runs["status"]) == {"finished", "running"}


def test_runs_series_is_bucketed_to_max_points_with_exact_sums(synth_db: str) -> None:
    uid = "digits0064" + "0" * 22
    full = _data.runs_series(synth_db, (uid,), ("",), 2000)
    coarse = _data.runs_series(synth_db, (uid,), ("",), 37)
    assert len(full) == 600  # one bucket per step when the run is short
    assert len(coarse) <= 37
    assert coarse["n"].sum() == full["n"].sum() == 600
    assert coarse["sum_g_sq"].sum() == pytest.approx(full["sum_g_sq"].sum())
    assert coarse["sum_trace_sigma"].sum() / coarse["sum_g_sq"].sum() == pytest.approx(
        DIGITS_B_SIMPLE
    )
    assert coarse["step"].is_monotonic_increasing


def test_long_runs_read_the_block_table_and_agree(synth_db: str) -> None:
    uid = "digits0128" + "0" * 22
    # min_blocks: how many 64-sample blocks make a run "long" (read from sample_block)
    from_samples = _data.runs_series(synth_db, (uid,), ("",), 5, min_blocks=math.inf)
    from_blocks = _data.runs_series(synth_db, (uid,), ("",), 5, min_blocks=0.0)
    assert from_blocks["n"].sum() == from_samples["n"].sum() == 600
    assert from_blocks["sum_g_sq"].sum() == pytest.approx(from_samples["sum_g_sq"].sum())
    total = _model.smooth(from_blocks, method="window", window_steps=1e9)
    assert total["b_simple"].iloc[-1] == pytest.approx(DIGITS_B_SIMPLE)


def test_raw_samples_csv(synth_db: str) -> None:
    lines = _data.raw_samples_csv(synth_db, "digits0016" + "0" * 22).splitlines()
    assert lines[0].startswith("seq,step,examples")
    assert len(lines) == 1 + 600


def test_layers_and_events(synth_db: str) -> None:
    uid = "lm" + "0" * 30
    assert _data.series_names(synth_db, uid) == ["", *LM_LAYERS]
    events = _data.run_events(synth_db, uid)
    assert events["step"].tolist() == [200]
    assert events["label"].tolist() == ["batch size 4096 → 8192"]
    series = _data.runs_series(synth_db, (uid,), ("", *LM_LAYERS), 100)
    assert set(series["series"]) == {"", *LM_LAYERS}
    # the batch in use follows the change at step 200
    whole = series[series["series"] == ""]
    assert whole["batch_size"].iloc[0] == 4096 and whole["batch_size"].iloc[-1] == 8192
