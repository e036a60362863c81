"""The Run page's charts: B_simple with its band and the batch in use, one quantity against x,
and B_simple per layer; batch-size changes and events as marks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import altair as alt
import pandas as pd

from noisescope import protocol
from noisescope_dashboard._charts._axes import (
    SCHEME,
    TALL,
    TIP,
    XAxis,
    drawable,
    finish,
    layered,
    line_mark,
    values_in,
    wide_legend,
    y_encoding,
)

#: The Run page's B_simple chart: one legend for its layers (``what`` column of each layer).
B_LEGEND = {
    "B_simple": "#1f77b4",
    "90% interval": "#9ecae9",
    "batch in use": "#d62728",
    "batch-size change": "#7f7f7f",
    "other event": "#9467bd",
}
LOSS_LEGEND = {"training loss": "#1f77b4", "evaluation loss": "#ff7f0e"}


def _legend(mapping: dict[str, str], names: Sequence[str], title: str | None = None) -> alt.Color:
    """A fixed colour per layer name, so layers of different marks share one legend."""
    return alt.Color(
        "what:N",
        title=title,
        scale=alt.Scale(domain=list(names), range=[mapping[n] for n in names]),
        legend=alt.Legend(orient="bottom", labelLimit=0, symbolStrokeWidth=3, symbolOpacity=1),
    )


def _events(events: pd.DataFrame | None, x: str, *, legend: bool) -> list[Any]:
    """Vertical dashed marks at batch-size changes and other events (``kind``, ``label``
    columns), named "batch-size change" or "other event" in the chart's legend when
    ``legend``."""
    if events is None or events.empty:
        return []
    data = events.dropna(subset=[x])
    if data.empty:
        return []
    data = data.assign(
        what=[
            "batch-size change" if k == protocol.BATCH_SIZE_EVENT_KIND else "other event"
            for k in data["kind"]
        ]
    )
    base = alt.Chart(data)
    rule = (
        base.mark_rule(strokeDash=[4, 3], strokeWidth=1.5)
        if legend
        else base.mark_rule(strokeDash=[4, 3], strokeWidth=1.5, color="#7f7f7f")
    )
    tooltip = [
        alt.Tooltip("label:N", title="event"),
        alt.Tooltip("step:Q", title="step", format=","),
    ]
    if legend:
        return [rule.encode(x=alt.X(f"{x}:Q"), color=alt.Color("what:N"), tooltip=tooltip)]
    return [rule.encode(x=alt.X(f"{x}:Q"), tooltip=tooltip)]


def event_names(events: pd.DataFrame | None, x: str) -> list[str]:
    """The legend entries ``_events`` adds for these events."""
    if events is None or events.empty:
        return []
    kinds = set(events.dropna(subset=[x])["kind"])
    names = ["batch-size change"] if protocol.BATCH_SIZE_EVENT_KIND in kinds else []
    return names + (["other event"] if kinds - {protocol.BATCH_SIZE_EVENT_KIND} else [])


def _b_simple_axes(
    frame: pd.DataFrame,
    x: XAxis,
    y_title: str,
    log_y: bool,
    more_y: Sequence[float] = (),
) -> tuple[pd.DataFrame, pd.DataFrame, alt.X, alt.Y]:
    """B_simple's band and line rows (those these axes can draw) and the axes that hold both,
    and ``more_y``."""
    band = drawable(frame, [x.field, "b_simple_lo", "b_simple_hi"], log_y)
    line = drawable(frame, [x.field, "b_simple"], log_y)
    y_values = values_in(line, "b_simple") + values_in(band, "b_simple_lo", "b_simple_hi")
    x_enc = x.encoding(values_in(frame, x.field))
    y_enc = y_encoding("b_simple", y_title, [*y_values, *more_y], log=log_y)
    return band, line, x_enc, y_enc


def _band(band: pd.DataFrame, x_enc: alt.X, color: alt.Color, *, opacity: float) -> alt.Chart:
    """The 90% interval of B_simple, ``b_simple_lo`` to ``b_simple_hi``, as an area."""
    area: alt.Chart = (
        alt.Chart(band)
        .mark_area(opacity=opacity)
        .encode(x=x_enc, y=alt.Y("b_simple_lo:Q"), y2=alt.Y2("b_simple_hi:Q"), color=color)
    )
    return area


def b_simple_chart(
    frame: pd.DataFrame,
    *,
    x: XAxis,
    log_y: bool = True,
    events: pd.DataFrame | None = None,
    y_title: str = "B_simple (batch size)",
    title: str = "B_simple with its 90% interval and the batch in use",
) -> alt.LayerChart:
    """B_simple over its band (``b_simple_lo``..``b_simple_hi``) and the batch in use, stepped.

    One legend names every layer: "B_simple", "90% interval", "batch in use" and, when there are
    any, "batch-size change". ``frame`` is ``_frames.series_points`` of a run's series.
    """
    batch = drawable(frame, [x.field, "batch_size"], log_y)
    band, line, x_enc, y_enc = _b_simple_axes(
        frame, x, y_title, log_y, more_y=values_in(batch, "batch_size")
    )
    names = ["B_simple", "90% interval", "batch in use", *event_names(events, x.field)]
    color = _legend(B_LEGEND, names)
    tip_x = x.tooltip()
    layers: list[Any] = [
        _band(band.assign(what="90% interval"), x_enc, color, opacity=0.45),
        alt.Chart(line.assign(what="B_simple"))
        .mark_line(**line_mark(len(line), strokeWidth=2))
        .encode(
            x=x_enc,
            y=y_enc,
            color=color,
            tooltip=[
                tip_x,
                alt.Tooltip("b_simple:Q", title="B_simple", format=TIP),
                alt.Tooltip("b_simple_lo:Q", title="90% interval from", format=TIP),
                alt.Tooltip("b_simple_hi:Q", title="90% interval to", format=TIP),
            ],
        ),
        alt.Chart(batch.assign(what="batch in use"))
        .mark_line(strokeDash=[6, 4], interpolate="step-after", strokeWidth=2)
        .encode(
            x=x_enc,
            y=alt.Y("batch_size:Q"),
            color=color,
            tooltip=[tip_x, alt.Tooltip("batch_size:Q", title="batch in use", format=",")],
        ),
        *_events(events, x.field, legend=True),
    ]
    return finish(layered(*layers), title)


def metric_chart(
    frame: pd.DataFrame,
    *,
    x: XAxis,
    y: str,
    y_title: str,
    title: str,
    log_y: bool = False,
    events: pd.DataFrame | None = None,
    evals: pd.DataFrame | None = None,
) -> alt.LayerChart:
    """One quantity (|G|², tr(Σ), loss, learning rate) against ``x``; ``evals`` (columns
    ``x`` and ``loss``) are evaluation losses drawn as points beside the training loss."""
    data = drawable(frame, [x.field, y], log_y)
    points = None if evals is None else drawable(evals, [x.field, "loss"], log_y)
    has_evals = points is not None and not points.empty
    y_values = values_in(data, y) + (values_in(points, "loss") if points is not None else [])
    x_values = values_in(data, x.field) + (values_in(points, x.field) if points is not None else [])
    x_enc = x.encoding(x_values)
    y_enc = y_encoding(y, y_title, y_values, log=log_y)
    tip_x = x.tooltip()
    line = alt.Chart(data).mark_line(**line_mark(len(data)))
    layers: list[Any] = []
    if has_evals and points is not None:
        names = ["training loss", "evaluation loss"]
        color = _legend(LOSS_LEGEND, names)
        layers.append(
            line.transform_calculate(what="'training loss'").encode(
                x=x_enc,
                y=y_enc,
                color=color,
                tooltip=[tip_x, alt.Tooltip(f"{y}:Q", title=y_title, format=TIP)],
            )
        )
        layers.append(
            alt.Chart(points.assign(what="evaluation loss"))
            .mark_point(filled=True, size=60)
            .encode(
                x=alt.X(f"{x.field}:Q"),
                y=alt.Y("loss:Q"),
                color=color,
                tooltip=[
                    alt.Tooltip("step:Q", title="step", format=","),
                    alt.Tooltip("loss:Q", title="evaluation loss", format=TIP),
                ],
            )
        )
    else:
        layers.append(
            line.encode(
                x=x_enc, y=y_enc, tooltip=[tip_x, alt.Tooltip(f"{y}:Q", title=y_title, format=TIP)]
            )
        )
    layers += _events(events, x.field, legend=False)
    return finish(layered(*layers), title)


def layers_chart(
    frame: pd.DataFrame, *, x: XAxis, log_y: bool = True, y_title: str = "B_simple (batch size)"
) -> alt.LayerChart:
    """B_simple per layer (``layer`` column), each over its own light band."""
    band, line, x_enc, y_enc = _b_simple_axes(frame, x, y_title, log_y)
    color = alt.Color(
        "layer:N", title="layer", scale=alt.Scale(scheme=SCHEME), legend=wide_legend()
    )
    layers = [
        _band(band, x_enc, color, opacity=0.15),
        alt.Chart(line)
        .mark_line(**line_mark(int(line.groupby("layer").size().min()) if len(line) else 0))
        .encode(
            x=x_enc,
            y=y_enc,
            color=color,
            tooltip=[
                alt.Tooltip("layer:N"),
                x.tooltip(),
                alt.Tooltip("b_simple:Q", title="B_simple", format=TIP),
            ],
        ),
    ]
    return finish(layered(*layers), "B_simple per layer", TALL)
