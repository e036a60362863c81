"""The What-if page's charts: time against compute as devices double, and the speed-up."""

from __future__ import annotations

import altair as alt
import pandas as pd

from noisescope_dashboard._charts._axes import (
    TALL,
    finish,
    named_colours,
    scale_axis,
    values_in,
    x_encoding,
    y_encoding,
)
from noisescope_dashboard._frames._what_if import PAST, PAYS


def tradeoff_chart(rows: pd.DataFrame, *, units: str) -> alt.LayerChart:
    """Time (S/S_min) against compute (E/E_min) for 1, 2, 4, ... devices, each point labelled
    with its device count; points past the device limit in grey.

    ``rows``: devices, batch_size, steps_ratio, examples_ratio, speedup, waste, label, past.
    """
    x = x_encoding(
        "examples_ratio",
        f"{units} ÷ minimum {units} (compute)",
        values_in(rows, "examples_ratio"),
        log=True,
    )
    y = y_encoding(
        "steps_ratio", "steps ÷ minimum steps (time)", values_in(rows, "steps_ratio"), log=True
    )
    tip = [
        alt.Tooltip("devices:Q", title="devices", format=","),
        alt.Tooltip("batch_size:Q", title="batch size", format=","),
        alt.Tooltip("steps_ratio:Q", title="S / S_min", format=".3~r"),
        alt.Tooltip("examples_ratio:Q", title="E / E_min", format=".3~r"),
        alt.Tooltip("waste:Q", title="compute beyond the minimum", format=".0%"),
    ]
    color = named_colours("past:N", {PAYS: "#1f77b4", PAST: "#9e9e9e"})
    layers = [
        alt.Chart(rows).mark_line(color="#bdbdbd").encode(x=x, y=y, order="devices:Q"),
        alt.Chart(rows).mark_point(filled=True, size=80).encode(x=x, y=y, color=color, tooltip=tip),
        alt.Chart(rows)
        .mark_text(align="left", dx=8, dy=-8, fontSize=12)
        .encode(x=x, y=y, text=alt.Text("label:N")),
    ]
    return finish(alt.layer(*layers), "Time against compute as devices double", TALL)


def speedup_chart(rows: pd.DataFrame) -> alt.LayerChart:
    """Speed-up over one device against devices, beside ideal scaling (speed-up = devices).

    ``rows``: devices, speedup, ideal, past.
    """
    devices = [float(d) for d in rows["devices"]]
    dev_scale = alt.Scale(
        type="log", base=2, domain=[min(devices), max(devices)], nice=False, padding=0
    )
    x = alt.X(
        "devices:Q",
        title="devices",
        scale=dev_scale,
        axis=alt.Axis(values=devices, format=","),
    )
    y_scale, y_axis = scale_axis(values_in(rows, "speedup", "ideal"), True)
    long = pd.concat(
        [
            rows.assign(what="S-E model", value=rows["speedup"]),
            rows.assign(what="ideal (speed-up = devices)", value=rows["ideal"]),
        ],
        ignore_index=True,
    )
    lines = {"S-E model": "#1f77b4", "ideal (speed-up = devices)": "#7f7f7f"}
    # the legend draws each line as a short stroke (solid, dashed): its default symbol, a
    # filled circle with the dash pattern, rendered as a blob (issue 47)
    legend = alt.Legend(
        orient="bottom",
        columns=2,
        labelLimit=0,
        symbolLimit=0,
        symbolOpacity=1,
        symbolType="stroke",
        symbolStrokeWidth=2,
        symbolSize=600,
    )
    color = alt.Color(
        "what:N",
        title=None,
        scale=alt.Scale(domain=list(lines), range=list(lines.values())),
        legend=legend,
    )
    # the same field, domain and legend as the colour, so Vega-Lite draws one legend of both
    # (a legend=None here conflicted with the colour's: "Conflicting legend property")
    dash = alt.StrokeDash(
        "what:N",
        title=None,
        scale=alt.Scale(domain=list(lines), range=[[1, 0], [6, 4]]),
        legend=legend,
    )
    chart = (
        alt.Chart(long)
        .mark_line(point=alt.OverlayMarkDef(filled=True, size=40))
        .encode(
            x=x,
            y=alt.Y("value:Q", title="speed-up over one device", scale=y_scale, axis=y_axis),
            color=color,
            strokeDash=dash,
            tooltip=[
                alt.Tooltip("devices:Q", title="devices", format=","),
                alt.Tooltip("what:N", title=" "),
                alt.Tooltip("value:Q", title="speed-up", format=".3~r"),
            ],
        )
    )
    return finish(chart, "Speed-up against devices", TALL)
