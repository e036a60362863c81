"""Chart builders: pure functions from small frames (made by ``_frames``) to Altair charts.

They never touch Streamlit or the API, so tests check them through ``chart.to_dict()`` (which
validates against the Vega-Lite schema). Titles live outside the charts (the pages put them in
``st.subheader``, where they wrap instead of being clipped); each chart carries its title as
its Vega-Lite ``description`` (read by screen readers and by the tests). Log axes are ticked at
1-2-5 × 10^k or at powers of ten, labelled without exponents.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, Final, cast

import altair as alt
import pandas as pd

__all__ = [
    "AXIS_FORMAT",
    "b_simple_chart",
    "b_simple_vs_b_crit_chart",
    "bcrit_vs_loss_chart",
    "compare_chart",
    "log_ticks",
    "metric_chart",
    "speedup_chart",
    "sweep_chart",
    "tradeoff_chart",
]

#: d3 number format of every axis and tooltip: grouped digits, no exponent, no trailing zeros.
AXIS_FORMAT = ",~r"
_TIP = ",.4~r"

#: A log axis ends at least this factor beyond the data.
PAD = 1.04
#: Categorical colours that stay apart (runs, tasks, layers, targets).
SCHEME: Final = "tableau10"

_HEIGHT = 300
_TALL = 420
_SQUARE = 520

#: The Run page's B_simple chart: one legend for its layers (``what`` column of each layer).
B_LEGEND = {
    "B_simple": "#1f77b4",
    "90% interval": "#9ecae9",
    "batch in use": "#d62728",
    "batch-size change": "#7f7f7f",
    "other event": "#9467bd",
}
LOSS_LEGEND = {"training loss": "#1f77b4", "evaluation loss": "#ff7f0e"}


# --- axes ------------------------------------------------------------------------------------


def log_ticks(values: Iterable[float]) -> tuple[list[float], tuple[float, float]] | None:
    """Ticks for a log axis over ``values``: 1-2-5 × 10^k over up to ~2.5 decades, powers of
    ten beyond (every other one past 8 decades), and the domain from the tick at or below the
    smallest value to the tick at or above the largest, so both ends are labelled."""
    pos = [float(v) for v in values if v is not None and math.isfinite(v) and v > 0]
    if not pos:
        return None
    lo, hi = min(pos), max(pos)
    decades = math.log10(hi / lo) if hi > lo else 0.0
    mantissas: Sequence[float] = (1.0, 2.0, 5.0) if decades <= 2.5 else (1.0,)
    stride = 2 if decades > 8 else 1
    k_lo, k_hi = math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1
    candidates = sorted(
        float(f"{m * 10.0**k:.12g}")
        for k in range(k_lo, k_hi + 1)
        if (k - k_lo) % stride == 0
        for m in mantissas
    )
    # a little room beyond the data, so no line runs along the frame
    below = max(t for t in candidates if t <= lo / PAD)
    above = min(t for t in candidates if t >= hi * PAD)
    if below == above:  # a single value: one step either side
        i = candidates.index(below)
        below, above = candidates[max(i - 1, 0)], candidates[min(i + 1, len(candidates) - 1)]
    return [t for t in candidates if below <= t <= above], (below, above)


def _scale_axis(values: Iterable[float], log: bool, **scale: Any) -> tuple[alt.Scale, alt.Axis]:
    if log:
        ticks = log_ticks(values)
        if ticks is not None:
            return (
                alt.Scale(type="log", domain=list(ticks[1]), nice=False, padding=0, **scale),
                alt.Axis(values=ticks[0], format=AXIS_FORMAT),
            )
        return alt.Scale(type="log", **scale), alt.Axis(format=AXIS_FORMAT)
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    flat = bool(finite) and max(finite) - min(finite) <= 1e-9 * max(map(abs, finite))
    # a constant series (a fixed learning rate) would otherwise be zoomed into rounding noise
    return alt.Scale(zero=flat, **scale), alt.Axis(format=AXIS_FORMAT)


def _x(field: str, title: str, values: Iterable[float], *, log: bool, **scale: Any) -> alt.X:
    s, a = _scale_axis(values, log, **scale)
    return alt.X(f"{field}:Q", title=title, scale=s, axis=a)


def _y(field: str, title: str, values: Iterable[float], *, log: bool, **scale: Any) -> alt.Y:
    s, a = _scale_axis(values, log, **scale)
    return alt.Y(f"{field}:Q", title=title, scale=s, axis=a)


def _positive(frame: pd.DataFrame, columns: Sequence[str], log: bool) -> pd.DataFrame:
    """Rows a log axis can draw: every one of ``columns`` present and, on a log axis, > 0."""
    out = frame.dropna(subset=list(columns))
    if log:
        for c in columns:
            out = out[out[c] > 0]
    return out


def _column(frame: pd.DataFrame, *names: str) -> list[float]:
    out: list[float] = []
    for n in names:
        if n in frame.columns:
            out += [float(v) for v in frame[n].dropna()]
    return out


def _legend(mapping: dict[str, str], names: Sequence[str], title: str | None = None) -> alt.Color:
    """A fixed colour per layer name, so layers of different marks share one legend."""
    return alt.Color(
        "what:N",
        title=title,
        scale=alt.Scale(domain=list(names), range=[mapping[n] for n in names]),
        legend=alt.Legend(orient="bottom", labelLimit=0, symbolStrokeWidth=3, symbolOpacity=1),
    )


def _wide_legend() -> alt.Legend:
    """A legend under the chart whose labels are never cut (long run and task names)."""
    return alt.Legend(orient="bottom", columns=2, labelLimit=0, symbolLimit=0, symbolOpacity=1)


def _finish(chart: Any, title: str, height: int = _HEIGHT) -> alt.LayerChart:
    return cast(
        alt.LayerChart,
        chart.properties(width="container", height=height, description=title),
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
        what=["batch-size change" if k == "batch_size" else "other event" for k in data["kind"]]
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
    names = ["batch-size change"] if "batch_size" in kinds else []
    return names + (["other event"] if kinds - {"batch_size"} else [])


# --- the Run page ----------------------------------------------------------------------------


def b_simple_chart(
    frame: pd.DataFrame,
    *,
    x: str,
    x_title: str,
    log_x: bool = False,
    log_y: bool = True,
    events: pd.DataFrame | None = None,
    y_title: str = "B_simple (batch size)",
    title: str = "B_simple with its 90% interval and the batch in use",
) -> alt.LayerChart:
    """B_simple over its band (``b_simple_lo``..``b_simple_hi``) and the batch in use, stepped.

    One legend names every layer: "B_simple", "90% interval", "batch in use" and, when there are
    any, "batch-size change". ``frame`` is ``_frames.points`` of a run's series.
    """
    band = _positive(frame, [x, "b_simple_lo", "b_simple_hi"], log_y)
    line = _positive(frame, [x, "b_simple"], log_y)
    batch = _positive(frame, [x, "batch_size"], log_y)
    names = ["B_simple", "90% interval", "batch in use", *event_names(events, x)]
    y_values = _column(line, "b_simple") + _column(band, "b_simple_lo", "b_simple_hi")
    y_values += _column(batch, "batch_size")
    x_enc = _x(x, x_title, _column(frame, x), log=log_x)
    y_enc = _y("b_simple", y_title, y_values, log=log_y)
    color = _legend(B_LEGEND, names)
    tip_x = alt.Tooltip(f"{x}:Q", title=x_title, format=_TIP)
    layers: list[Any] = [
        alt.Chart(band.assign(what="90% interval"))
        .mark_area(opacity=0.45)
        .encode(x=x_enc, y=alt.Y("b_simple_lo:Q"), y2=alt.Y2("b_simple_hi:Q"), color=color),
        alt.Chart(line.assign(what="B_simple"))
        .mark_line(interpolate="monotone", strokeWidth=2)
        .encode(
            x=x_enc,
            y=y_enc,
            color=color,
            tooltip=[
                tip_x,
                alt.Tooltip("b_simple:Q", title="B_simple", format=_TIP),
                alt.Tooltip("b_simple_lo:Q", title="90% interval from", format=_TIP),
                alt.Tooltip("b_simple_hi:Q", title="90% interval to", format=_TIP),
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
        *_events(events, x, legend=True),
    ]
    return _finish(alt.layer(*layers), title)


def metric_chart(
    frame: pd.DataFrame,
    *,
    x: str,
    x_title: str,
    y: str,
    y_title: str,
    title: str,
    log_x: bool = False,
    log_y: bool = False,
    events: pd.DataFrame | None = None,
    evals: pd.DataFrame | None = None,
) -> alt.LayerChart:
    """One quantity (|G|², tr(Σ), loss, learning rate) against ``x``; ``evals`` (columns
    ``x`` and ``loss``) are evaluation losses drawn as points beside the training loss."""
    data = _positive(frame, [x, y], log_y)
    points = None if evals is None else _positive(evals, [x, "loss"], log_y)
    has_evals = points is not None and not points.empty
    y_values = _column(data, y) + (_column(points, "loss") if points is not None else [])
    x_values = _column(data, x) + (_column(points, x) if points is not None else [])
    x_enc = _x(x, x_title, x_values, log=log_x)
    y_enc = _y(y, y_title, y_values, log=log_y)
    tip_x = alt.Tooltip(f"{x}:Q", title=x_title, format=_TIP)
    line = alt.Chart(data).mark_line(interpolate="monotone")
    layers: list[Any] = []
    if has_evals and points is not None:
        names = ["training loss", "evaluation loss"]
        color = _legend(LOSS_LEGEND, names)
        layers.append(
            line.transform_calculate(what="'training loss'").encode(
                x=x_enc,
                y=y_enc,
                color=color,
                tooltip=[tip_x, alt.Tooltip(f"{y}:Q", title=y_title, format=_TIP)],
            )
        )
        layers.append(
            alt.Chart(points.assign(what="evaluation loss"))
            .mark_point(filled=True, size=60)
            .encode(
                x=alt.X(f"{x}:Q"),
                y=alt.Y("loss:Q"),
                color=color,
                tooltip=[
                    alt.Tooltip("step:Q", title="step", format=","),
                    alt.Tooltip("loss:Q", title="evaluation loss", format=_TIP),
                ],
            )
        )
    else:
        layers.append(
            line.encode(
                x=x_enc, y=y_enc, tooltip=[tip_x, alt.Tooltip(f"{y}:Q", title=y_title, format=_TIP)]
            )
        )
    layers += _events(events, x, legend=False)
    return _finish(alt.layer(*layers), title)


def layers_chart(
    frame: pd.DataFrame,
    *,
    x: str,
    x_title: str,
    log_x: bool = False,
    log_y: bool = True,
    y_title: str = "B_simple (batch size)",
) -> alt.LayerChart:
    """B_simple per layer (``layer`` column), each over its own light band."""
    band = _positive(frame, [x, "b_simple_lo", "b_simple_hi"], log_y)
    line = _positive(frame, [x, "b_simple"], log_y)
    y_values = _column(line, "b_simple") + _column(band, "b_simple_lo", "b_simple_hi")
    x_enc = _x(x, x_title, _column(frame, x), log=log_x)
    y_enc = _y("b_simple", y_title, y_values, log=log_y)
    color = alt.Color(
        "layer:N", title="layer", scale=alt.Scale(scheme=SCHEME), legend=_wide_legend()
    )
    layers = [
        alt.Chart(band)
        .mark_area(opacity=0.15)
        .encode(x=x_enc, y=alt.Y("b_simple_lo:Q"), y2=alt.Y2("b_simple_hi:Q"), color=color),
        alt.Chart(line)
        .mark_line(interpolate="monotone")
        .encode(
            x=x_enc,
            y=y_enc,
            color=color,
            tooltip=[
                alt.Tooltip("layer:N"),
                alt.Tooltip(f"{x}:Q", title=x_title, format=_TIP),
                alt.Tooltip("b_simple:Q", title="B_simple", format=_TIP),
            ],
        ),
    ]
    return _finish(alt.layer(*layers), "B_simple per layer", _TALL)


# --- comparisons -----------------------------------------------------------------------------


def compare_chart(
    frame: pd.DataFrame,
    *,
    x: str,
    x_title: str,
    color: str,
    color_title: str,
    title: str,
    log_x: bool = False,
    log_y: bool = True,
    reverse_x: bool = False,
    y_title: str = "B_simple (batch size)",
) -> alt.LayerChart:
    """B_simple of several runs, one colour per ``color`` (a run or a task), one line per run
    (``run`` column); clicking a legend entry highlights it (Altair ``bind="legend"``)."""
    data = _positive(frame, [x, "b_simple"], log_y)
    if log_x:
        data = data[data[x] > 0]
    pick = alt.selection_point(fields=[color], bind="legend", name="legend_pick")
    chart = (
        alt.Chart(data)
        .mark_line(interpolate="monotone", strokeWidth=2)
        .encode(
            x=_x(x, x_title, _column(data, x), log=log_x, reverse=reverse_x),
            y=_y("b_simple", y_title, _column(data, "b_simple"), log=log_y),
            color=alt.Color(
                f"{color}:N",
                title=color_title,
                scale=alt.Scale(scheme=SCHEME),
                legend=_wide_legend(),
            ),
            detail=alt.Detail("run:N"),
            opacity=alt.when(pick).then(alt.value(1.0)).otherwise(alt.value(0.12)),
            tooltip=[
                alt.Tooltip("task:N", title="task"),
                alt.Tooltip("run_name:N", title="run"),
                alt.Tooltip(f"{x}:Q", title=x_title, format=_TIP),
                alt.Tooltip("b_simple:Q", title="B_simple", format=_TIP),
            ],
        )
        .add_params(pick)
    )
    return _finish(chart, title, _TALL)


# --- the critical batch size -----------------------------------------------------------------


def sweep_chart(points: pd.DataFrame, curves: pd.DataFrame, *, units: str) -> alt.LayerChart:
    """The S-E plane as the paper draws it: each run's steps and examples to reach each target
    (filled: the frontier runs the fit used; hollow: the others) and the fitted hyperbola.

    ``points``: target, run, batch_size, lr, steps, examples, frontier (bool).
    ``curves``: target, batch_size, steps, examples along S = S_min(1 + B_crit/B),
    E = E_min(1 + B/B_crit) (``TargetResult.curve``).
    """
    pts = _positive(points, ["steps", "examples"], True)
    crv = _positive(curves, ["steps", "examples"], True)
    x = _x("steps", "optimizer steps to reach the target", _column(pts, "steps"), log=True)
    y = _y("examples", f"{units} to reach the target", _column(pts, "examples"), log=True)
    color = alt.Color(
        "target:N", title="loss target", scale=alt.Scale(scheme=SCHEME), legend=_wide_legend()
    )
    tip = [
        alt.Tooltip("target:N", title="loss target"),
        alt.Tooltip("run:N", title="run"),
        alt.Tooltip("batch_size:Q", title="batch size", format=","),
        alt.Tooltip("lr:Q", title="learning rate", format=_TIP),
        alt.Tooltip("steps:Q", title="steps", format=_TIP),
        alt.Tooltip("examples:Q", title=units, format=_TIP),
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
    return _finish(alt.layer(*layers), "Steps and examples to reach each loss target", _TALL)


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
    y = _y(
        "value", f"batch size ({units})", _column(data, "value", "lo_shown", "hi_shown"), log=True
    )
    color = alt.Color(
        "quantity:N",
        title=None,
        scale=alt.Scale(
            domain=["B_crit (sweep fit)", "B_simple at the same loss"],
            range=["#d62728", "#1f77b4"],
        ),
        legend=_wide_legend(),
    )
    tip = [
        alt.Tooltip("quantity:N", title=" "),
        alt.Tooltip("loss:Q", title="loss target", format=_TIP),
        alt.Tooltip("value:Q", title="value", format=_TIP),
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
    return _finish(
        alt.layer(*layers), "B_crit against loss, beside B_simple at the same loss", _TALL
    )


def b_simple_vs_b_crit_chart(frame: pd.DataFrame) -> alt.LayerChart:
    """B_simple against B_crit across tasks (McCandlish et al., Fig. 5): one point per task and
    loss target, error bars on both axes, the line y = x for reference.

    ``frame``: task, target, units, b_crit, b_simple and their shown interval ends
    (``b_crit_lo_shown`` ...), plus ``b_crit_interval``/``b_simple_interval`` text.
    """
    values = _column(
        frame,
        "b_crit",
        "b_simple",
        "b_crit_lo_shown",
        "b_crit_hi_shown",
        "b_simple_lo_shown",
        "b_simple_hi_shown",
    )
    ticks = log_ticks(values)
    both, axis = _scale_axis(values, True)
    x = alt.X("b_crit:Q", title="B_crit from the sweep fit (task units)", scale=both, axis=axis)
    y = alt.Y("b_simple:Q", title="B_simple at the same loss (task units)", scale=both, axis=axis)
    color = alt.Color("task:N", title="task", scale=alt.Scale(scheme=SCHEME), legend=_wide_legend())
    tip = [
        alt.Tooltip("task:N", title="task"),
        alt.Tooltip("target:Q", title="loss target", format=_TIP),
        alt.Tooltip("units:N", title="units"),
        alt.Tooltip("b_crit:Q", title="B_crit", format=_TIP),
        alt.Tooltip("b_crit_interval:N", title="B_crit 90% interval"),
        alt.Tooltip("b_simple:Q", title="B_simple", format=_TIP),
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
        .encode(x=x, y=y, color=color, shape=alt.Shape("units:N", title="units"), tooltip=tip),
    ]
    # square, as the paper draws it: y = x runs at 45 degrees
    return cast(
        alt.LayerChart,
        alt.layer(*layers).properties(
            width=_SQUARE, height=_SQUARE, description="B_simple against B_crit across tasks"
        ),
    )


# --- what-if ---------------------------------------------------------------------------------


def tradeoff_chart(rows: pd.DataFrame, *, units: str) -> alt.LayerChart:
    """Time (S/S_min) against compute (E/E_min) for 1, 2, 4, ... devices, each point labelled
    with its device count; points past the device limit in grey.

    ``rows``: devices, batch_size, steps_ratio, examples_ratio, speedup, waste, label, past.
    """
    x = _x(
        "examples_ratio",
        f"{units} ÷ minimum {units} (compute)",
        _column(rows, "examples_ratio"),
        log=True,
    )
    y = _y("steps_ratio", "steps ÷ minimum steps (time)", _column(rows, "steps_ratio"), log=True)
    tip = [
        alt.Tooltip("devices:Q", title="devices", format=","),
        alt.Tooltip("batch_size:Q", title="batch size", format=","),
        alt.Tooltip("steps_ratio:Q", title="S / S_min", format=".3~r"),
        alt.Tooltip("examples_ratio:Q", title="E / E_min", format=".3~r"),
        alt.Tooltip("waste:Q", title="compute beyond the minimum", format=".0%"),
    ]
    color = alt.Color(
        "past:N",
        title=None,
        scale=alt.Scale(
            domain=["each doubling pays", "past the limit"], range=["#1f77b4", "#9e9e9e"]
        ),
        legend=_wide_legend(),
    )
    layers = [
        alt.Chart(rows).mark_line(color="#bdbdbd").encode(x=x, y=y, order="devices:Q"),
        alt.Chart(rows).mark_point(filled=True, size=80).encode(x=x, y=y, color=color, tooltip=tip),
        alt.Chart(rows)
        .mark_text(align="left", dx=8, dy=-8, fontSize=12)
        .encode(x=x, y=y, text=alt.Text("label:N")),
    ]
    return _finish(alt.layer(*layers), "Time against compute as devices double", _TALL)


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
    y_scale, y_axis = _scale_axis(_column(rows, "speedup", "ideal"), True)
    long = pd.concat(
        [
            rows.assign(what="S-E model", value=rows["speedup"]),
            rows.assign(what="ideal (speed-up = devices)", value=rows["ideal"]),
        ],
        ignore_index=True,
    )
    color = alt.Color(
        "what:N",
        title=None,
        scale=alt.Scale(
            domain=["S-E model", "ideal (speed-up = devices)"], range=["#1f77b4", "#7f7f7f"]
        ),
        legend=_wide_legend(),
    )
    chart = (
        alt.Chart(long)
        .mark_line(point=True)
        .encode(
            x=x,
            y=alt.Y("value:Q", title="speed-up over one device", scale=y_scale, axis=y_axis),
            color=color,
            strokeDash=alt.StrokeDash("what:N", legend=None),
            tooltip=[
                alt.Tooltip("devices:Q", title="devices", format=","),
                alt.Tooltip("what:N", title=" "),
                alt.Tooltip("value:Q", title="speed-up", format=".3~r"),
            ],
        )
    )
    return _finish(chart, "Speed-up against devices", _TALL)
