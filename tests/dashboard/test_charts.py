"""Chart builders, checked on their Vega-Lite specs (``to_dict`` validates against the schema)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import pytest

from noisescope_dashboard import _charts
from noisescope_dashboard._charts import log_ticks
from noisescope_dashboard._charts._axes import interval_ends, log_extent

from ._vega import spec_layers

MAX_POINTS = 2000


def _series(n: int = 50) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "x": [float(i) for i in range(1, n + 1)],
            "step": [float(i) for i in range(1, n + 1)],
            "b_simple": [100.0 + i for i in range(n)],
            "b_simple_lo": [80.0 + i for i in range(n)],
            "b_simple_hi": [120.0 + i for i in range(n)],
            "batch_size": [64.0] * n,
            "g_sq": [1.0] * n,
            "loss": [2.0 / (1 + i) for i in range(n)],
        }
    )


def _mark(layer: dict[str, Any]) -> str:
    mark = layer["mark"]
    return str(mark["type"] if isinstance(mark, dict) else mark)


def _is_125(value: float) -> bool:
    mantissa = value / 10 ** math.floor(math.log10(value))
    return any(math.isclose(mantissa, m) for m in (1, 2, 5))


@pytest.mark.parametrize(
    ("lo", "hi"),
    [(40.0, 64.0), (1.0, 32.0), (3.0, 9_000.0), (0.002, 0.7), (1e-3, 1e9), (100.0, 100.0)],
)
def test_log_ticks_are_1_2_5_or_powers_of_ten_and_frame_the_data(lo: float, hi: float) -> None:
    result = log_ticks([lo, hi])
    assert result is not None
    ticks, (below, above) = result
    assert below <= lo and above >= hi
    assert ticks[0] == below and ticks[-1] == above
    assert all(_is_125(t) for t in ticks)
    if math.log10(hi / lo) > 2.5:
        assert all(math.isclose(math.log10(t), round(math.log10(t))) for t in ticks)
    assert len(ticks) >= 2


def test_log_ticks_ignore_what_a_log_axis_cannot_draw() -> None:
    assert log_ticks([]) is None
    assert log_ticks([0.0, -1.0, float("nan")]) is None
    assert log_ticks([0.0, 10.0, 20.0]) is not None


def test_interval_ends_reach_the_axis_below_and_stay_open_above() -> None:
    """One rule for every log-axis interval: a lower end missing or <= 0 is drawn at the
    floor, an upper end missing or infinite at the ceiling; finite ends stay as they are."""
    nan, inf = float("nan"), math.inf
    lo, hi = interval_ends(
        [5.0, 0.0, -2.0, None, nan], [50.0, inf, None, nan, 7.0], floor=1.0, ceiling=100.0
    )
    assert lo == [5.0, 1.0, 1.0, 1.0, 1.0]
    assert hi == [50.0, 100.0, 100.0, 100.0, 7.0]


def test_log_extent_pads_the_positive_finite_values() -> None:
    assert log_extent([4.0, None, -1.0, 0.0, math.inf, 20.0], 2.0) == (2.0, 40.0)
    assert log_extent([None, 0.0], 2.0) == (0.5, 20.0)


def test_b_simple_chart_band_line_batch_and_one_legend() -> None:
    events = pd.DataFrame(
        {"step": [20], "kind": ["batch_size"], "label": ["64 → 128"], "x": [20.0]}
    )
    spec = _charts.b_simple_chart(_series(), x=_charts.XAxis("x", "step"), events=events).to_dict()
    layers = spec_layers(spec)
    assert [_mark(layer) for layer in layers] == ["area", "line", "line", "rule"]
    band, line, batch, rule = layers
    assert band["encoding"]["y"]["field"] == "b_simple_lo"
    assert band["encoding"]["y2"]["field"] == "b_simple_hi"
    assert line["encoding"]["y"]["scale"]["type"] == "log"
    assert line["encoding"]["y"]["axis"]["format"] == _charts.AXIS_FORMAT
    assert batch["encoding"]["y"]["field"] == "batch_size"
    assert batch["mark"]["strokeDash"]
    domain = line["encoding"]["color"]["scale"]["domain"]
    assert domain == ["B_simple", "90% interval", "batch in use", "batch-size change"]
    assert rule["encoding"]["color"]["field"] == "what"
    assert spec["description"] == "B_simple with its 90% interval and the batch in use"
    assert "title" not in spec  # titles live above the chart, where they wrap


def test_b_simple_chart_linear_scale() -> None:
    spec = _charts.b_simple_chart(_series(), x=_charts.XAxis("x", "examples seen"), log_y=False)
    line = spec_layers(spec.to_dict())[1]
    assert line["encoding"]["x"]["title"] == "examples seen"
    assert line["encoding"]["y"]["scale"].get("type", "linear") == "linear"


def test_log_scale_drops_non_positive_values() -> None:
    frame = _series(4).assign(g_sq=[1.0, -2.0, 0.0, 3.0])
    chart = _charts.metric_chart(
        frame, x=_charts.XAxis("x", "step"), y="g_sq", y_title="|G|²", title="|G|²", log_y=True
    )
    spec = chart.to_dict()
    data = next(iter(spec["datasets"].values()))
    assert [row["g_sq"] for row in data] == [1.0, 3.0]


def test_loss_chart_draws_evaluations_as_points_in_its_legend() -> None:
    evals = pd.DataFrame({"step": [10, 20], "loss": [0.5, 0.3], "x": [10.0, 20.0]})
    spec = _charts.metric_chart(
        _series(), x=_charts.XAxis("x", "step"), y="loss", y_title="loss", title="Loss", evals=evals
    ).to_dict()
    line, points = spec_layers(spec)
    assert _mark(points) == "point"
    assert line["encoding"]["color"]["scale"]["domain"] == ["training loss", "evaluation loss"]


def test_compare_chart_has_an_uncut_legend_that_highlights_on_click() -> None:
    frame = pd.DataFrame(
        {
            "task": ["a", "a", "b", "b"],
            "run": ["r1", "r1", "r2", "r2"],
            "run_name": ["one", "one", "two", "two"],
            "loss": [2.0, 1.0, 3.0, 2.5],
            "b_simple": [10.0, 20.0, 1000.0, 2000.0],
        }
    )
    spec = _charts.compare_chart(
        frame,
        x=_charts.XAxis("loss", "loss", reverse=True),
        color="task",
        color_title="task",
        title="t",
    ).to_dict()
    assert spec["encoding"]["color"]["field"] == "task"
    assert spec["encoding"]["color"]["legend"]["labelLimit"] == 0
    assert spec["encoding"]["detail"]["field"] == "run"
    assert spec["encoding"]["x"]["scale"]["reverse"] is True
    (param,) = spec["params"]
    assert param["bind"] == "legend"
    assert param["select"]["fields"] == ["task"]
    assert spec["encoding"]["opacity"]["condition"][0]["param"] == param["name"]


def test_sweep_chart_fills_the_frontier_and_draws_the_hyperbola() -> None:
    points = pd.DataFrame(
        {
            "target": ["loss 0.5"] * 4,
            "run": ["a", "b", "c", "d"],
            "batch_size": [16.0, 64.0, 256.0, 256.0],
            "lr": [0.1, 0.1, 0.1, 0.4],
            "steps": [90.0, 30.0, 15.0, 25.0],
            "examples": [1440.0, 1920.0, 3840.0, 6400.0],
            "frontier": [True, True, True, False],
        }
    )
    curves = pd.DataFrame(
        {
            "target": ["loss 0.5"] * 3,
            "batch_size": [8.0, 64.0, 512.0],
            "steps": [150.0, 30.0, 12.0],
            "examples": [1200.0, 1920.0, 6000.0],
        }
    )
    spec = _charts.sweep_chart(points, curves, units="examples").to_dict()
    curve, hollow, filled = spec_layers(spec)
    assert [_mark(curve), _mark(hollow), _mark(filled)] == ["line", "point", "point"]
    assert hollow["mark"]["filled"] is False and filled["mark"]["filled"] is True
    assert filled["encoding"]["x"]["scale"]["type"] == "log"


def test_b_simple_vs_b_crit_chart_has_both_error_bars_and_the_diagonal() -> None:
    frame = pd.DataFrame(
        {
            "task": ["a/x", "b/y"],
            "target": [0.5, 2.0],
            "units": ["tokens", "tokens"],
            "b_crit": [200.0, 8000.0],
            "b_simple": [100.0, 6000.0],
            "b_crit_lo_shown": [150.0, 7000.0],
            "b_crit_hi_shown": [250.0, 9000.0],
            "b_simple_lo_shown": [90.0, 5000.0],
            "b_simple_hi_shown": [110.0, 7000.0],
            "b_crit_interval": ["150 – 250", "7,000 – 9,000"],
            "b_simple_interval": ["90 – 110", "5,000 – 7,000"],
        }
    )
    spec = _charts.b_simple_vs_b_crit_chart(frame, units="tokens").to_dict()
    # the title the page shows above it
    assert spec["description"] == "B_simple against B_crit across tasks in tokens"
    _diagonal, x_bars, y_bars, points = spec_layers(spec)
    assert x_bars["encoding"]["x2"]["field"] == "b_crit_hi_shown"
    assert y_bars["encoding"]["y2"]["field"] == "b_simple_hi_shown"
    assert points["encoding"]["x"]["scale"] == points["encoding"]["y"]["scale"]
    assert points["encoding"]["y"]["title"] == "B_simple at the same loss (tokens)"
    assert spec["width"] == "container"  # the page's full width (issue 47)


def test_parallelism_charts() -> None:
    rows = pd.DataFrame(
        {
            "devices": [1, 2, 4],
            "batch_size": [16.0, 32.0, 64.0],
            "steps_ratio": [13.0, 7.0, 4.0],
            "examples_ratio": [1.1, 1.2, 1.3],
            "speedup": [1.0, 1.9, 3.3],
            "waste": [0.08, 0.14, 0.25],
            "label": ["1 device", "2 devices", "4 devices"],
            "ideal": [1.0, 2.0, 4.0],
            "past": ["each doubling pays", "each doubling pays", "past the limit"],
        }
    )
    trade = _charts.tradeoff_chart(rows, units="examples").to_dict()
    assert [_mark(layer) for layer in spec_layers(trade)] == ["line", "point", "text"]
    speed = _charts.speedup_chart(rows).to_dict()
    assert speed["encoding"]["x"]["axis"]["values"] == [1.0, 2.0, 4.0]


@pytest.mark.parametrize("n", [10, MAX_POINTS])
def test_charts_ship_the_rows_they_are_given(n: int) -> None:
    """Builders never expand data: the server's bucket count is what reaches the browser."""
    spec = _charts.b_simple_chart(_series(n), x=_charts.XAxis("x", "step")).to_dict()
    assert max(len(rows) for rows in spec["datasets"].values()) == n


def test_png_and_csv_downloads_render_offline() -> None:
    from noisescope_dashboard import _ui

    frame = _series(3)
    chart = _charts.metric_chart(
        frame, x=_charts.XAxis("x", "step"), y="g_sq", y_title="|G|²", title="|G|²"
    )
    png = _ui._png(chart, "|G|²")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert _ui._csv(frame[["step", "g_sq"]]).splitlines() == [
        "step,g_sq",
        "1.0,1.0",
        "2.0,1.0",
        "3.0,1.0",
    ]
