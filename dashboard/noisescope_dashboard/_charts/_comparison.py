"""The Compare pages' charts: B_simple of several runs, coloured by run or task, and per
group of runs (a batch size or learning rate) as a median line with a band."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import altair as alt
import pandas as pd

from noisescope_dashboard._charts._axes import (
    SCHEME,
    TALL,
    TIP,
    XAxis,
    drawable,
    drawn_colours,
    finish,
    named_colours,
    scale_axis,
    values_in,
    wide_legend,
    y_encoding,
)


def compare_chart(
    frame: pd.DataFrame,
    *,
    x: XAxis,
    color: str,
    color_title: str,
    title: str,
    log_y: bool = True,
    y_title: str = "B_simple (batch size)",
    colours: Mapping[str, str] | None = None,
) -> alt.LayerChart:
    """B_simple of several runs, one colour per ``color`` (a run or a task), one line per run
    (``run`` column); clicking a legend entry highlights it (Altair ``bind="legend"``).
    ``colours`` (name to colour, ``palette_colours``) keeps each name's colour across a page's
    charts; without it the colours follow this chart's names."""
    data = drawable(frame, [x.field, "b_simple"], log_y)
    if x.log:
        data = data[data[x.field] > 0]
    pick = alt.selection_point(fields=[color], bind="legend", name="legend_pick")
    chart = (
        alt.Chart(data)
        .mark_line(interpolate="monotone", strokeWidth=2)
        .encode(
            x=x.encoding(values_in(data, x.field)),
            y=y_encoding("b_simple", y_title, values_in(data, "b_simple"), log=log_y),
            color=alt.Color(
                f"{color}:N",
                title=color_title,
                scale=alt.Scale(scheme=SCHEME),
                legend=wide_legend(),
            )
            if colours is None
            else named_colours(
                f"{color}:N", drawn_colours(colours, data[color]), title=color_title
            ),
            detail=alt.Detail("run:N"),
            opacity=alt.when(pick).then(alt.value(1.0)).otherwise(alt.value(0.12)),
            tooltip=[
                alt.Tooltip("task:N", title="task"),
                alt.Tooltip("run_name:N", title="run"),
                x.tooltip(),
                alt.Tooltip("b_simple:Q", title="B_simple", format=TIP),
            ],
        )
        .add_params(pick)
    )
    return finish(chart, title, TALL)


def band_chart(
    bands: pd.DataFrame,
    runs: pd.DataFrame | None,
    *,
    x: XAxis,
    group_title: str,
    title: str,
    log_y: bool = True,
    y_title: str = "B_simple (batch size)",
    ranges: bool = True,
) -> alt.LayerChart:
    """B_simple against loss per group of runs (a batch size or a learning rate): the median
    line over its runs and, with ``ranges``, a band from their lowest to their highest value
    (``bands``, from ``_frames.band_points``), one colour per group in its order; with
    ``runs`` (compare points with a ``group`` column) each run as a thin line of its group's
    colour too. Clicking a legend entry highlights that group."""
    data = drawable(bands, [x.field, "b_simple", "lo", "hi"], log_y)
    if x.log:
        data = data[data[x.field] > 0]
    order = list(dict.fromkeys(data.sort_values("order")["group"]))
    pick = alt.selection_point(fields=["group"], bind="legend", name="group_pick")
    shown = values_in(data, "b_simple", "lo", "hi") if ranges else values_in(data, "b_simple")
    drawn_runs = None
    if runs is not None and not runs.empty:
        drawn_runs = drawable(runs, [x.field, "b_simple"], log_y)
        if x.log:
            drawn_runs = drawn_runs[drawn_runs[x.field] > 0]
        shown += values_in(drawn_runs, "b_simple")
    x_enc = x.encoding(values_in(data, x.field))
    y_scale, y_axis = scale_axis(shown, log_y)
    y_enc = alt.Y("b_simple:Q", title=y_title, scale=y_scale, axis=y_axis)
    color = alt.Color(
        "group:N",
        title=group_title,
        sort=order,
        scale=alt.Scale(scheme="viridis", domain=order),
        legend=wide_legend(),
    )
    base = alt.Chart(data)
    layers: list[Any] = []
    if ranges:
        layers.append(
            base.mark_area(opacity=0.18, interpolate="monotone").encode(
                x=x_enc,
                y=alt.Y("lo:Q", scale=y_scale, axis=y_axis, title=y_title),
                y2="hi:Q",
                color=color,
                detail="group:N",
                opacity=alt.when(pick).then(alt.value(0.22)).otherwise(alt.value(0.03)),
            )
        )
    # The runs' thin lines and the groups' median line below are two layers, alike in form:
    # different data (one line per run vs per group), widths, highlight opacities and tooltips.
    if drawn_runs is not None:
        layers.append(
            alt.Chart(drawn_runs)
            .mark_line(interpolate="monotone", strokeWidth=1)
            .encode(
                x=x_enc,
                y=y_enc,
                color=color,
                detail="run:N",
                opacity=alt.when(pick).then(alt.value(0.45)).otherwise(alt.value(0.05)),
                tooltip=[
                    alt.Tooltip("run_name:N", title="run"),
                    alt.Tooltip("group:N", title=group_title),
                    x.tooltip(),
                    alt.Tooltip("b_simple:Q", title="B_simple", format=TIP),
                ],
            )
        )
    layers.append(
        base.mark_line(interpolate="monotone", strokeWidth=2.5)
        .encode(
            x=x_enc,
            y=y_enc,
            color=color,
            detail="group:N",
            opacity=alt.when(pick).then(alt.value(1.0)).otherwise(alt.value(0.15)),
            tooltip=[
                alt.Tooltip("group:N", title=group_title),
                x.tooltip(),
                alt.Tooltip("b_simple:Q", title="median B_simple", format=TIP),
                alt.Tooltip("lo:Q", title="lowest run", format=TIP),
                alt.Tooltip("hi:Q", title="highest run", format=TIP),
                alt.Tooltip("runs:Q", title="runs"),
            ],
        )
        .add_params(pick)
    )
    return finish(alt.layer(*layers), title, TALL)
