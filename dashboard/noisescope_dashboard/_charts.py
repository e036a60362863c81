"""Chart builders: pure functions from data frames to Altair charts.

They never touch Streamlit or the database, so tests check them through ``chart.to_dict()``
(which validates against the Vega-Lite schema) and the pages stay thin. Frames arrive already
bucketed in SQL (at most ``MAX_POINTS`` rows per series), so no builder aggregates.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar, cast

import altair as alt
import pandas as pd

__all__ = [
    "MAX_POINTS",
    "X_TITLES",
    "b_simple_chart",
    "bcrit_vs_loss_chart",
    "compare_chart",
    "metric_chart",
    "sweep_chart",
    "tradeoff_chart",
]

#: The most points one series may send to the browser (issue 10: "~2000 per series").
MAX_POINTS = 2000

#: Axis titles for the x choices every page offers.
X_TITLES = {
    "step": "optimizer step",
    "examples": "examples seen",
    "tokens": "tokens seen",
    "time": "wall time (s since start)",
    "progress": "training progress (fraction of steps)",
    "loss": "training loss",
}

_WIDTH = "container"
_HEIGHT = 260


def _x(x: str, *, log: bool = False, reverse: bool = False) -> alt.X:
    scale = alt.Scale(type="log" if log else "linear", reverse=reverse, zero=False)
    return alt.X(f"{x}:Q", title=X_TITLES.get(x, x), scale=scale)


def _y(field: str, title: str, *, log: bool) -> alt.Y:
    scale = alt.Scale(type="log") if log else alt.Scale(zero=False)
    return alt.Y(f"{field}:Q", title=title, scale=scale)


C = TypeVar("C", alt.Chart, alt.LayerChart)


def _layer(*charts: Any) -> alt.LayerChart:
    return cast(alt.LayerChart, alt.layer(*charts))


def _props(chart: C, title: str) -> C:
    return chart.properties(title=title, width=_WIDTH, height=_HEIGHT)


def metric_chart(
    frame: pd.DataFrame,
    *,
    x: str,
    y: str,
    title: str,
    y_title: str | None = None,
    log_y: bool = False,
    log_x: bool = False,
    color: str | None = None,
    events: pd.DataFrame | None = None,
) -> alt.LayerChart:
    """One quantity (|G|^2, tr(Sigma), loss, lr) against the chosen x, one line per ``color``."""
    data = frame.dropna(subset=[x, y])
    if log_y:
        data = data[data[y] > 0]
    enc: dict[str, Any] = {
        "x": _x(x, log=log_x),
        "y": _y(y, y_title or title, log=log_y),
        "tooltip": [alt.Tooltip(f"{x}:Q"), alt.Tooltip(f"{y}:Q", format=".4g")],
    }
    if color is not None:
        enc["color"] = alt.Color(f"{color}:N", title=color)
    line = alt.Chart(data).mark_line(interpolate="monotone").encode(**enc)
    layers: list[Any] = [line]
    if events is not None and not events.empty:
        layers.append(_event_rules(events, x))
    return _props(_layer(*layers), title)


def _event_rules(events: pd.DataFrame, x: str) -> alt.Chart:
    """Vertical marks at batch-size changes and other events (issue 8's scheduler writes them)."""
    data = events.dropna(subset=[x])
    return cast(
        alt.Chart,
        alt.Chart(data)
        .mark_rule(color="#7f7f7f", strokeDash=[4, 3])
        .encode(
            x=alt.X(f"{x}:Q"),
            tooltip=[alt.Tooltip("kind:N"), alt.Tooltip("label:N"), alt.Tooltip("step:Q")],
        ),
    )


def b_simple_chart(
    frame: pd.DataFrame,
    *,
    x: str,
    log_y: bool = True,
    log_x: bool = False,
    color: str | None = None,
    batch_size: bool = True,
    events: pd.DataFrame | None = None,
    title: str = "B_simple = tr(Σ) / |G|² with its interval",
) -> alt.LayerChart:
    """B_simple as a line over its confidence band (mark_area lo..hi), the batch in use dashed.

    ``frame`` columns: ``x``, ``b_simple``, ``b_simple_lo``, ``b_simple_hi`` and, when
    ``batch_size`` is set, ``batch_size`` (the batch actually in use, from B_big per bucket).
    """
    data = frame.dropna(subset=[x])
    color_enc: dict[str, Any] = {}
    if color is not None:
        color_enc["color"] = alt.Color(f"{color}:N", title=color)
    x_enc = _x(x, log=log_x)
    band_data = data.dropna(subset=["b_simple_lo", "b_simple_hi"])
    if log_y:
        band_data = band_data[(band_data["b_simple_lo"] > 0) & (band_data["b_simple_hi"] > 0)]
    band = (
        alt.Chart(band_data)
        .mark_area(opacity=0.25)
        .encode(
            x=x_enc,
            y=_y("b_simple_lo", "B_simple", log=log_y),
            y2=alt.Y2("b_simple_hi:Q"),
            **color_enc,
        )
    )
    line_data = data.dropna(subset=["b_simple"])
    if log_y:
        line_data = line_data[line_data["b_simple"] > 0]
    tooltip = [
        alt.Tooltip(f"{x}:Q"),
        alt.Tooltip("b_simple:Q", format=".4g", title="B_simple"),
        alt.Tooltip("b_simple_lo:Q", format=".4g", title="lower"),
        alt.Tooltip("b_simple_hi:Q", format=".4g", title="upper"),
    ]
    line = (
        alt.Chart(line_data)
        .mark_line(interpolate="monotone")
        .encode(x=x_enc, y=_y("b_simple", "B_simple", log=log_y), tooltip=tooltip, **color_enc)
    )
    layers: list[Any] = [band, line]
    if batch_size and "batch_size" in data.columns:
        batch = (
            alt.Chart(data.dropna(subset=["batch_size"]))
            .mark_line(strokeDash=[6, 4], color="#d62728", interpolate="step-after")
            .encode(
                x=x_enc,
                y=alt.Y("batch_size:Q"),
                tooltip=[alt.Tooltip(f"{x}:Q"), alt.Tooltip("batch_size:Q", title="batch in use")],
            )
        )
        layers.append(batch)
    if events is not None and not events.empty:
        layers.append(_event_rules(events, x))
    return _props(_layer(*layers), title)


def compare_chart(
    frame: pd.DataFrame,
    *,
    x: str,
    y: str = "b_simple",
    color: str = "task",
    detail: str = "run",
    log_x: bool = False,
    log_y: bool = True,
    reverse_x: bool = False,
    title: str,
) -> alt.Chart:
    """Several runs or tasks on one chart, one colour per ``color``, legend click to highlight.

    The legend is bound to a point selection (Altair's ``bind="legend"``): clicking a task fades
    the others, the paper's noise-scale-grows-as-loss-falls view across tasks.
    """
    data = frame.dropna(subset=[x, y])
    if log_y:
        data = data[data[y] > 0]
    if log_x:
        data = data[data[x] > 0]
    pick = alt.selection_point(fields=[color], bind="legend", name="legend_pick")
    chart = cast(
        alt.Chart,
        alt.Chart(data)
        .mark_line(point=False, interpolate="monotone")
        .encode(
            x=_x(x, log=log_x, reverse=reverse_x),
            y=_y(y, "B_simple" if y == "b_simple" else y, log=log_y),
            color=alt.Color(f"{color}:N", title=color),
            detail=alt.Detail(f"{detail}:N"),
            opacity=alt.when(pick).then(alt.value(1.0)).otherwise(alt.value(0.12)),
            tooltip=[
                alt.Tooltip(f"{color}:N"),
                alt.Tooltip(f"{detail}:N"),
                alt.Tooltip(f"{x}:Q", format=".4g"),
                alt.Tooltip(f"{y}:Q", format=".4g"),
            ],
        )
        .add_params(pick),
    )
    return _props(chart, title)


def sweep_chart(points: pd.DataFrame, curves: pd.DataFrame, *, units: str) -> alt.LayerChart:
    """Steps vs examples to reach each loss target, with the fitted S-E hyperbola per target.

    ``points``: target, batch_size, steps, examples (one row per run that reached the target).
    ``curves``: target, steps, examples along (S/S_min - 1)(E/E_min - 1) = 1 (science.md).
    """
    enc_color = alt.Color("target:N", title="loss target")
    x = alt.X("steps:Q", title="optimizer steps to reach the target", scale=alt.Scale(type="log"))
    y = alt.Y("examples:Q", title=f"{units} to reach the target", scale=alt.Scale(type="log"))
    dots = (
        alt.Chart(points)
        .mark_point(filled=True, size=60)
        .encode(
            x=x,
            y=y,
            color=enc_color,
            tooltip=[
                "target:N",
                "batch_size:Q",
                "steps:Q",
                alt.Tooltip("examples:Q", format=".4g"),
            ],
        )
    )
    lines = (
        alt.Chart(curves)
        .mark_line(strokeDash=[5, 3])
        .encode(x=x, y=y, color=enc_color, order="batch_size:Q")
    )
    return _props(_layer(lines, dots), "Steps vs examples per loss target, fitted S-E model")


def bcrit_vs_loss_chart(frame: pd.DataFrame, *, units: str) -> alt.LayerChart:
    """B_crit fitted per loss target beside B_simple measured at the same loss, one chart.

    ``frame`` columns: loss, value, lo, hi, quantity ("B_crit (fit)" or "B_simple (measured)").
    """
    x = alt.X("loss:Q", title="loss target", scale=alt.Scale(reverse=True, zero=False))
    y = alt.Y("value:Q", title=f"batch size ({units})", scale=alt.Scale(type="log"))
    color = alt.Color("quantity:N", title="")
    points = (
        alt.Chart(frame)
        .mark_line(point=True)
        .encode(
            x=x,
            y=y,
            color=color,
            tooltip=[
                "quantity:N",
                alt.Tooltip("loss:Q", format=".4g"),
                alt.Tooltip("value:Q", format=".4g"),
                alt.Tooltip("lo:Q", format=".4g"),
                alt.Tooltip("hi:Q", format=".4g"),
            ],
        )
    )
    bars_data = frame.dropna(subset=["lo", "hi"])
    bars_data = bars_data[(bars_data["lo"] > 0) & (bars_data["hi"] > 0)]
    bars = alt.Chart(bars_data).mark_rule().encode(x=x, y="lo:Q", y2="hi:Q", color=color)
    return _props(_layer(bars, points), "B_crit against loss, with B_simple at the same loss")


def tradeoff_chart(curve: pd.DataFrame, chosen: pd.DataFrame, *, units: str) -> alt.LayerChart:
    """Time (steps) against compute (examples), both relative to their minimum, chosen point marked.

    ``curve`` and ``chosen`` columns: batch_size, steps_ratio, examples_ratio.
    """
    x = alt.X(
        "examples_ratio:Q",
        title=f"{units} / minimum (compute)",
        scale=alt.Scale(type="log"),
    )
    y = alt.Y("steps_ratio:Q", title="steps / minimum (time)", scale=alt.Scale(type="log"))
    tip = [
        alt.Tooltip("batch_size:Q", format=".4g"),
        alt.Tooltip("steps_ratio:Q", format=".3f"),
        alt.Tooltip("examples_ratio:Q", format=".3f"),
    ]
    line = alt.Chart(curve).mark_line().encode(x=x, y=y, order="batch_size:Q", tooltip=tip)
    point = (
        alt.Chart(chosen)
        .mark_point(filled=True, size=160, color="#d62728", shape="diamond")
        .encode(x=x, y=y, tooltip=tip)
    )
    label = (
        alt.Chart(chosen)
        .mark_text(align="left", dx=10, dy=-8)
        .encode(x=x, y=y, text=alt.Text("label:N"))
    )
    return _props(_layer(line, point, label), "Time/compute trade-off (science.md model)")


def spec_layers(spec: dict[str, Any]) -> Sequence[dict[str, Any]]:
    """The layers of a Vega-Lite spec (a single view counts as one layer); for tests and docs."""
    layers = spec.get("layer")
    return list(layers) if layers is not None else [spec]
