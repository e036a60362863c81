"""The Compare pages' chart: B_simple of several runs, coloured by run or task."""

from __future__ import annotations

from collections.abc import Mapping

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
