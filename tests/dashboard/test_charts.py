"""Chart builders, checked on their Vega-Lite specs (``to_dict`` validates against the schema)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from noisescope_dashboard import _charts
from noisescope_dashboard._charts import spec_layers


def _series(n: int = 50) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "step": range(1, n + 1),
            "examples": [64.0 * i for i in range(1, n + 1)],
            "b_simple": [100.0 + i for i in range(n)],
            "b_simple_lo": [80.0 + i for i in range(n)],
            "b_simple_hi": [120.0 + i for i in range(n)],
            "batch_size": [64.0] * n,
            "g_sq": [1.0] * n,
        }
    )


def _mark(layer: dict[str, Any]) -> str:
    mark = layer["mark"]
    return str(mark["type"] if isinstance(mark, dict) else mark)


def test_b_simple_chart_draws_band_under_line_with_batch_and_events() -> None:
    events = pd.DataFrame({"step": [20], "kind": ["batch_size_change"], "label": ["64 → 128"]})
    spec = _charts.b_simple_chart(_series(), x="step", log_y=True, events=events).to_dict()
    layers = spec_layers(spec)
    assert [_mark(layer) for layer in layers] == ["area", "line", "line", "rule"]
    band, line, batch, rule = layers
    assert band["encoding"]["y"]["field"] == "b_simple_lo"
    assert band["encoding"]["y2"]["field"] == "b_simple_hi"
    assert band["encoding"]["y"]["scale"]["type"] == "log"
    assert line["encoding"]["y"]["field"] == "b_simple"
    assert line["encoding"]["x"]["field"] == "step"
    assert batch["encoding"]["y"]["field"] == "batch_size"
    assert batch["mark"]["strokeDash"]
    assert rule["encoding"]["x"]["field"] == "step"


def test_b_simple_chart_linear_scale_and_examples_axis() -> None:
    spec = _charts.b_simple_chart(_series(), x="examples", log_y=False).to_dict()
    line = spec_layers(spec)[1]
    assert line["encoding"]["x"]["field"] == "examples"
    assert line["encoding"]["x"]["title"] == "examples seen"
    assert line["encoding"]["y"]["scale"].get("type", "linear") == "linear"


def test_log_scale_drops_non_positive_values() -> None:
    frame = _series(4).assign(g_sq=[1.0, -2.0, 0.0, 3.0])
    chart = _charts.metric_chart(frame, x="step", y="g_sq", title="|G|²", log_y=True)
    spec = chart.to_dict()
    data = next(iter(spec["datasets"].values()))
    assert [row["g_sq"] for row in data] == [1.0, 3.0]
    assert spec_layers(spec)[0]["encoding"]["y"]["scale"]["type"] == "log"


def test_compare_chart_has_interactive_legend_one_colour_per_task() -> None:
    frame = pd.DataFrame(
        {
            "task": ["a", "a", "b", "b"],
            "run": ["r1", "r1", "r2", "r2"],
            "loss": [2.0, 1.0, 3.0, 2.5],
            "b_simple": [10.0, 20.0, 1000.0, 2000.0],
        }
    )
    spec = _charts.compare_chart(frame, x="loss", reverse_x=True, title="t").to_dict()
    assert spec["encoding"]["color"]["field"] == "task"
    assert spec["encoding"]["detail"]["field"] == "run"
    assert spec["encoding"]["x"]["scale"]["reverse"] is True
    (param,) = spec["params"]
    assert param["bind"] == "legend"
    assert param["select"]["fields"] == ["task"]
    assert spec["encoding"]["opacity"]["condition"][0]["param"] == param["name"]


def test_sweep_and_bcrit_and_tradeoff_charts() -> None:
    points = pd.DataFrame(
        {
            "target": ["0.5"] * 3,
            "batch_size": [16.0, 64.0, 256.0],
            "steps": [90.0, 30.0, 15.0],
            "examples": [1440.0, 1920.0, 3840.0],
        }
    )
    curves = points.assign(batch_size=[8.0, 64.0, 512.0])
    sweep = _charts.sweep_chart(points, curves, units="examples").to_dict()
    assert [_mark(layer) for layer in spec_layers(sweep)] == ["line", "point"]
    assert spec_layers(sweep)[1]["encoding"]["x"]["scale"]["type"] == "log"
    versus = pd.DataFrame(
        {
            "loss": [0.5, 0.5],
            "value": [200.0, 100.0],
            "lo": [150.0, 90.0],
            "hi": [250.0, 110.0],
            "quantity": ["B_crit (fit)", "B_simple"],
        }
    )
    bcrit = _charts.bcrit_vs_loss_chart(versus, units="examples").to_dict()
    assert [_mark(layer) for layer in spec_layers(bcrit)] == ["rule", "line"]
    assert spec_layers(bcrit)[1]["encoding"]["color"]["field"] == "quantity"
    curve = pd.DataFrame(
        {"batch_size": [1.0, 2.0], "steps_ratio": [3.0, 2.0], "examples_ratio": [1.5, 2.0]}
    )
    chosen = curve.head(1).assign(label="batch 1")
    trade = _charts.tradeoff_chart(curve, chosen, units="examples").to_dict()
    assert [_mark(layer) for layer in spec_layers(trade)] == ["line", "point", "text"]


@pytest.mark.parametrize("n", [10, _charts.MAX_POINTS])
def test_charts_ship_the_rows_they_are_given(n: int) -> None:
    """Builders never expand data: the SQL bucket count is what reaches the browser."""
    spec = _charts.b_simple_chart(_series(n), x="step").to_dict()
    assert max(len(rows) for rows in spec["datasets"].values()) == n
