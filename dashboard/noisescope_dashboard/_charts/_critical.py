"""The critical-batch charts: the S-E plane of a sweep, B_crit against loss, and B_simple
against B_crit across tasks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import altair as alt
import pandas as pd

from noisescope_dashboard._charts._axes import (
    AXIS_FORMAT,
    SCHEME,
    SQUARE,
    TALL,
    TIP,
    drawable,
    drawn_colours,
    finish,
    log_ticks,
    named_colours,
    palette_colours,
    scale_axis,
    values_in,
    wide_legend,
    x_encoding,
    y_encoding,
)


def sweep_chart(points: pd.DataFrame, curves: pd.DataFrame, *, units: str) -> alt.LayerChart:
    """The S-E plane as the paper draws it: each run's steps and examples to reach each target
    (filled: the frontier runs the fit used; hollow: the others) and the fitted hyperbola.

    ``points``: target, run, batch_size, lr, steps, examples, frontier (bool).
    ``curves``: target, batch_size, steps, examples along S = S_min(1 + B_crit/B),
    E = E_min(1 + B/B_crit) (``TargetResult.curve``).
    """
    pts = drawable(points, ["steps", "examples"], True)
    crv = drawable(curves, ["steps", "examples"], True)
    x = x_encoding(
        "steps", "optimizer steps to reach the target", values_in(pts, "steps"), log=True
    )
    y = y_encoding("examples", f"{units} to reach the target", values_in(pts, "examples"), log=True)
    color = alt.Color(
        "target:N", title="loss target", scale=alt.Scale(scheme=SCHEME), legend=wide_legend()
    )
    tip = [
        alt.Tooltip("target:N", title="loss target"),
        alt.Tooltip("run:N", title="run"),
        alt.Tooltip("batch_size:Q", title="batch size", format=","),
        alt.Tooltip("lr:Q", title="learning rate", format=TIP),
        alt.Tooltip("steps:Q", title="steps", format=TIP),
        alt.Tooltip("examples:Q", title=units, format=TIP),
        alt.Tooltip("used:N", title="in the fit"),
    ]
    pts = pts.assign(used=pts["frontier"].map({True: "yes (fastest lr)", False: "no"}))
    layers = [
        alt.Chart(crv)
        .mark_line(strokeDash=[5, 3], clip=True)
        .encode(x=x, y=y, color=color, order="batch_size:Q"),
        alt.Chart(pts[~pts["frontier"]])
        .mark_point(filled=False, size=60, strokeWidth=1.5)
        .encode(x=x, y=y, color=color, tooltip=tip),
        alt.Chart(pts[pts["frontier"]])
        .mark_point(filled=True, size=80)
        .encode(x=x, y=y, color=color, tooltip=tip),
    ]
    return finish(alt.layer(*layers), f"Steps and {units} to reach each loss target", TALL)


def _error_layers(
    frame: pd.DataFrame, *, x: str, y: str, lo: str, hi: str, color: alt.Color, vertical: bool
) -> Any:
    bars = frame.dropna(subset=[lo, hi])
    if vertical:
        return alt.Chart(bars).mark_rule(strokeWidth=2).encode(x=x, y=lo, y2=hi, color=color)
    return alt.Chart(bars).mark_rule(strokeWidth=2).encode(y=y, x=lo, x2=hi, color=color)


def bcrit_vs_loss_chart(frame: pd.DataFrame, *, units: str) -> alt.LayerChart:
    """B_crit per determined loss target beside B_simple measured at the same loss, each with
    its 90% interval (``lo_shown``/``hi_shown``: the interval clipped to the axis).

    ``frame``: loss, value, lo, hi, lo_shown, hi_shown, quantity, interval (text).
    """
    data = frame.dropna(subset=["value"])
    data = data[data["value"] > 0]
    x = alt.X(
        "loss:Q",
        title="loss target (falls to the right)",
        scale=alt.Scale(reverse=True, zero=False, padding=30),
        axis=alt.Axis(format=AXIS_FORMAT),
    )
    y = y_encoding(
        "value", f"batch size ({units})", values_in(data, "value", "lo_shown", "hi_shown"), log=True
    )
    color = named_colours(
        "quantity:N", {"B_crit (sweep fit)": "#d62728", "B_simple at the same loss": "#1f77b4"}
    )
    tip = [
        alt.Tooltip("quantity:N", title=" "),
        alt.Tooltip("loss:Q", title="loss target", format=TIP),
        alt.Tooltip("value:Q", title="value", format=TIP),
        alt.Tooltip("interval:N", title="90% interval"),
    ]
    layers = [
        _error_layers(
            data, x="loss:Q", y="value", lo="lo_shown", hi="hi_shown", color=color, vertical=True
        ),
        alt.Chart(data)
        .mark_line(point=alt.OverlayMarkDef(size=70, filled=True))
        .encode(x=x, y=y, color=color, tooltip=tip),
    ]
    return finish(alt.layer(*layers), "B_crit against loss, beside B_simple at the same loss", TALL)


def b_simple_vs_b_crit_chart(
    frame: pd.DataFrame, *, units: str, colours: Mapping[str, str] | None = None
) -> alt.LayerChart:
    """B_simple against B_crit across tasks (McCandlish et al., Fig. 5): one point per task and
    loss target, error bars on both axes, the line y = x for reference.

    ``frame``: task, target, b_crit, b_simple and their shown interval ends
    (``b_crit_lo_shown`` ...), plus ``b_crit_interval``/``b_simple_interval`` text, all in
    ``units`` ("examples" or "tokens": one chart per unit; "task units" for the paper's view,
    every task in its own units, which the page offers only on request).
    ``colours``: task to colour for the whole page (``palette_colours``; default: these tasks').
    """
    values = values_in(
        frame,
        "b_crit",
        "b_simple",
        "b_crit_lo_shown",
        "b_crit_hi_shown",
        "b_simple_lo_shown",
        "b_simple_hi_shown",
    )
    ticks = log_ticks(values)
    both, axis = scale_axis(values, True)
    x = alt.X("b_crit:Q", title=f"B_crit from the sweep fit ({units})", scale=both, axis=axis)
    y = alt.Y("b_simple:Q", title=f"B_simple at the same loss ({units})", scale=both, axis=axis)
    tasks = frame["task"]
    color = named_colours(
        "task:N", drawn_colours(colours or palette_colours(tasks), tasks), title="task"
    )
    tip = [
        alt.Tooltip("task:N", title="task"),
        alt.Tooltip("target:Q", title="loss target", format=TIP),
        alt.Tooltip("b_crit:Q", title="B_crit", format=TIP),
        alt.Tooltip("b_crit_interval:N", title="B_crit 90% interval"),
        alt.Tooltip("b_simple:Q", title="B_simple", format=TIP),
        alt.Tooltip("b_simple_interval:N", title="B_simple 90% interval"),
    ]
    lo, hi = ticks[1] if ticks is not None else (1.0, 10.0)
    diagonal = pd.DataFrame({"b_crit": [lo, hi], "b_simple": [lo, hi], "what": ["y = x"] * 2})
    layers = [
        alt.Chart(diagonal)
        .mark_line(color="#7f7f7f", strokeDash=[4, 4])
        .encode(x=x, y=y, tooltip=[alt.Tooltip("what:N", title="reference")]),
        alt.Chart(frame)
        .mark_rule(strokeWidth=1.5)
        .encode(x="b_crit_lo_shown:Q", x2="b_crit_hi_shown:Q", y="b_simple:Q", color=color),
        alt.Chart(frame)
        .mark_rule(strokeWidth=1.5)
        .encode(y="b_simple_lo_shown:Q", y2="b_simple_hi_shown:Q", x="b_crit:Q", color=color),
        alt.Chart(frame)
        .mark_point(filled=True, size=90)
        .encode(x=x, y=y, color=color, tooltip=tip),
    ]
    # at the page's full width (issue 47: a square third of the page was hard to read)
    return cast(
        alt.LayerChart,
        alt.layer(*layers).properties(
            width="container",
            height=SQUARE,
            description=f"B_simple against B_crit across tasks in {units}",
        ),
    )
