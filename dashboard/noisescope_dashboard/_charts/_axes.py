"""What every chart shares: number formats, log axes ticked at 1-2-5 x 10^k, scales, the legend
under the chart, sizes, and the title kept as the chart's description."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

import altair as alt
import pandas as pd

#: d3 number format of every axis and tooltip: grouped digits, no exponent, no trailing zeros.
AXIS_FORMAT = ",~r"
#: The same in tooltips, to four significant digits.
TIP = ",.4~r"

#: A log axis ends at least this factor beyond the data.
PAD = 1.04
#: Categorical colours that stay apart (runs, tasks, layers, targets).
SCHEME: Final = "tableau10"
#: SCHEME's colours in its order, for names that keep one colour across a page's charts.
PALETTE: Final = (
    "#4c78a8", "#f58518", "#e45756", "#72b7b2", "#54a24b",
    "#eeca3b", "#b279a2", "#ff9da6", "#9d755d", "#bab0ac",
)  # fmt: skip

#: Chart heights in pixels: most charts, the tall ones with a long legend, the square one.
HEIGHT = 300
TALL = 420
SQUARE = 520


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


def scale_axis(values: Iterable[float], log: bool, **scale: Any) -> tuple[alt.Scale, alt.Axis]:
    """Scale and axis for ``values``: log ones ticked by ``log_ticks``, linear ones from zero
    only when the values are constant."""
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


def x_encoding(
    field: str, title: str, values: Iterable[float], *, log: bool, **scale: Any
) -> alt.X:
    """A quantitative x channel scaled and ticked for ``values`` (``scale_axis``)."""
    s, a = scale_axis(values, log, **scale)
    return alt.X(f"{field}:Q", title=title, scale=s, axis=a)


@dataclass(frozen=True)
class XAxis:
    """The x axis a page draws its charts against: a column, its title, log or linear, and
    (the loss, which falls as training goes on) reversed."""

    field: str
    title: str
    log: bool = False
    reverse: bool = False

    def encoding(self, values: Iterable[float]) -> alt.X:
        """The x channel, scaled and ticked for ``values``."""
        scale = {"reverse": True} if self.reverse else {}
        return x_encoding(self.field, self.title, values, log=self.log, **scale)

    def tooltip(self) -> alt.Tooltip:
        return alt.Tooltip(f"{self.field}:Q", title=self.title, format=TIP)


def y_encoding(
    field: str, title: str, values: Iterable[float], *, log: bool, **scale: Any
) -> alt.Y:
    """A quantitative y channel scaled and ticked for ``values`` (``scale_axis``)."""
    s, a = scale_axis(values, log, **scale)
    return alt.Y(f"{field}:Q", title=title, scale=s, axis=a)


#: Fewer points than this are drawn as straight segments with each point marked: a smooth
#: curve through a handful of points shows a shape nobody measured (issue 56).
SMOOTH_FROM = 30


def line_mark(n_points: int, **kwargs: Any) -> dict[str, Any]:
    """``mark_line`` arguments for a curve of ``n_points``: smooth (monotone) when there are
    ``SMOOTH_FROM`` or more, else straight between marked points."""
    if n_points >= SMOOTH_FROM:
        return {"interpolate": "monotone", **kwargs}
    return {"interpolate": "linear", "point": True, **kwargs}


def drawable(frame: pd.DataFrame, columns: Sequence[str], log: bool) -> pd.DataFrame:
    """Rows a log axis can draw: every one of ``columns`` present and, on a log axis, > 0."""
    out = frame.dropna(subset=list(columns))
    if log:
        for c in columns:
            out = out[out[c] > 0]
    return out


def log_extent(values: Iterable[float | None], pad: float) -> tuple[float, float]:
    """A log axis's extent: the positive finite ``values`` widened by the factor ``pad`` each
    way (1 to 10, widened, when there are none)."""
    shown = [v for v in values if v is not None and math.isfinite(v) and v > 0] or [1.0, 10.0]
    return min(shown) / pad, max(shown) * pad


def interval_ends(
    lo: Iterable[float | None], hi: Iterable[float | None], floor: float, ceiling: float
) -> tuple[list[float], list[float]]:
    """Interval ends a log axis can draw: a lower end missing or at or below 0 becomes
    ``floor`` (the interval reaches the axis), an upper end missing or infinite ``ceiling``
    (it is open above). Tooltips give the true interval."""
    lo_shown = [v if v is not None and math.isfinite(v) and v > 0 else floor for v in lo]
    hi_shown = [v if v is not None and math.isfinite(v) else ceiling for v in hi]
    return lo_shown, hi_shown


def interval_rule(frame: pd.DataFrame, x: alt.X, scale: alt.Scale, color: alt.Color) -> alt.Chart:
    """Each point's interval as a vertical rule between its drawable ends (``lo_shown`` and
    ``hi_shown``, from ``interval_ends``) on the y ``scale``."""
    rule = alt.Chart(frame).mark_rule(strokeWidth=2)
    return cast(
        alt.Chart,
        rule.encode(x=x, y=alt.Y("lo_shown:Q", scale=scale), y2="hi_shown:Q", color=color),
    )


def values_in(frame: pd.DataFrame, *names: str) -> list[float]:
    """Every present value of the named columns (those the frame has), to fit an axis to."""
    out: list[float] = []
    for n in names:
        if n in frame.columns:
            out += [float(v) for v in frame[n].dropna()]
    return out


def wide_legend() -> alt.Legend:
    """A legend under the chart whose labels are never cut (long run and task names)."""
    return alt.Legend(orient="bottom", columns=2, labelLimit=0, symbolLimit=0, symbolOpacity=1)


def named_colours(field: str, colours: Mapping[str, str], title: str | None = None) -> alt.Color:
    """One fixed colour per named series (``colours``: name to colour, in legend order), the
    legend under the chart."""
    return alt.Color(
        field,
        title=title,
        scale=alt.Scale(domain=list(colours), range=list(colours.values())),
        legend=wide_legend(),
    )


def palette_colours(names: Iterable[str]) -> dict[str, str]:
    """One ``PALETTE`` colour per name, in order (repeating past ten): a page builds this once
    so a name keeps its colour in every chart, whichever names each chart draws."""
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(dict.fromkeys(names))}


def drawn_colours(colours: Mapping[str, str], drawn: Iterable[object]) -> dict[str, str]:
    """The part of ``colours`` a chart draws, in ``colours``' order: its legend lists only its
    own names, each in the page's colour."""
    here = {str(name) for name in drawn}
    return {name: colour for name, colour in colours.items() if name in here}


def layered(*layers: Any) -> alt.LayerChart:
    """The layers with rows to draw, layered (the first alone when none has): Vega warns
    "Infinite extent" for the fields of a layer whose data is empty, e.g. the band of a run
    too short for an interval."""
    drawn = [
        layer for layer in layers if not (isinstance(layer.data, pd.DataFrame) and layer.data.empty)
    ]
    return cast(alt.LayerChart, alt.layer(*(drawn or layers[:1])))


def finish(chart: Any, title: str, height: int = HEIGHT) -> alt.LayerChart:
    """The chart at the container's width, its title kept as its description."""
    return cast(
        alt.LayerChart,
        chart.properties(width="container", height=height, description=title),
    )
