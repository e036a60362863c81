"""The run page's branching section: the proxy (B_simple over training), the local measurement
(branch points) and the global one (the sweep's B_crit at the parent's loss) on one chart.

Pure frames and an Altair chart from API answers (``RunBranches``, ``RunSeries``,
``ForecastReport``); every quantity is a batch size in the run's own units, and a forecast in
other units is never drawn here (the caller checks).
"""

from __future__ import annotations

import math
from typing import Any, cast

import altair as alt
import pandas as pd

from noisescope import BranchPointResult, RunBranches, RunSeries
from noisescope.forecast import ForecastReport
from noisescope_dashboard import _frames, _text
from noisescope_dashboard._charts._axes import interval_ends, interval_rule, log_extent

__all__ = [
    "BRACKET",
    "B_SIMPLE",
    "LOCAL",
    "LOWER",
    "SWEEP",
    "SWEEP_EXTRAPOLATED",
    "TITLE",
    "chart",
    "curve",
    "local_mark",
    "marks",
    "table",
]

TITLE = "Critical batch size: B_simple, branch measurements, sweep"
B_SIMPLE = "B_simple (this run, 90% band)"
LOCAL = "local B_crit (branches, 90%)"
LOWER = "local B_crit above (all branches within ε)"
BRACKET = "local B_crit between two batch sizes (the grid does not resolve it)"
SWEEP = "sweep B_crit at the parent's loss (90%)"
SWEEP_EXTRAPOLATED = "sweep B_crit at the parent's loss, extrapolated (90%)"
_COLORS = {
    B_SIMPLE: "#7f7f7f",
    LOCAL: "#1f77b4",
    LOWER: "#9ecae1",
    BRACKET: "#6baed6",
    SWEEP: "#d62728",
    SWEEP_EXTRAPOLATED: "#ff9896",
}
_COLUMNS = ["step", "value", "lo", "hi", "quantity", "interval"]


def _forecast_at(forecast: ForecastReport | None, loss: float | None) -> Any:
    if forecast is None or loss is None:
        return None
    for p in forecast.predictions:
        if math.isclose(p.loss, loss, rel_tol=1e-12):
            return p
    return None


def local_mark(point: BranchPointResult) -> dict[str, Any] | None:
    """How a branch step's local B_crit is drawn: value, lo, hi, quantity (``LOCAL``, a
    ``BRACKET`` at its middle in log B, or a ``LOWER`` bound) and the interval's text for its
    tooltip; None when nothing is known."""
    lo, hi = point.b_crit_lo, point.b_crit_hi
    span = _text.interval(lo, hi)
    if point.b_crit is not None:  # without an interval when one seed left no spread to measure
        value, quantity, text = point.b_crit, LOCAL, span or "unknown"
    elif lo is not None and hi is not None:  # the span; its middle is no measurement
        value, quantity, text = math.sqrt(lo * hi), BRACKET, span
    elif lo is not None:
        value, quantity, text = lo, LOWER, f"above {_text.count(lo)}"
    else:
        return None
    return {"value": value, "lo": lo, "hi": hi, "quantity": quantity, "interval": text}


def marks(branches: RunBranches, forecast: ForecastReport | None) -> pd.DataFrame:
    """One row per measurement at a branch step: step, value, lo, hi, quantity, interval."""
    rows: list[dict[str, Any]] = []
    for p in branches.points:
        local = local_mark(p)
        if local is not None:
            rows.append({"step": p.step} | local)
        at = _forecast_at(forecast, p.parent_loss)
        if at is not None:
            rows.append(
                {"step": p.step, "value": at.b_crit, "lo": at.b_crit_lo, "hi": at.b_crit_hi}
                | {"quantity": SWEEP_EXTRAPOLATED if at.extrapolation else SWEEP}
                | {"interval": _text.interval(at.b_crit_lo, at.b_crit_hi) or "unknown"}
            )
    return pd.DataFrame(rows, columns=_COLUMNS)


def curve(series: RunSeries) -> pd.DataFrame:
    """B_simple along the run (on steps): step, value, lo, hi."""
    points = _frames.series_points(series)
    return pd.DataFrame(
        {
            "step": points["step"],
            "value": points["b_simple"],
            "lo": points["b_simple_lo"],
            "hi": points["b_simple_hi"],
        }
    )


def _open_interval(lo: float | None, hi: float | None) -> str:
    """ "lo – hi", with "?" for an end that is not bounded (above the largest batch tried)."""
    if lo is None and hi is None:
        return ""
    lo_text = _text.count(lo) if lo is not None else "?"
    hi_text = _text.count(hi) if hi is not None else "?"
    return f"{lo_text} – {hi_text}"


def _local_text(p: Any) -> str:
    """A number, "between lo and hi" (a bracket: the grid does not resolve the crossing),
    "> lo" (every batch within ε) or a dash."""
    if p.b_crit is not None:
        return _text.count(p.b_crit)
    if p.b_crit_lo is not None and p.b_crit_hi is not None:
        return f"between {_text.count(p.b_crit_lo)} and {_text.count(p.b_crit_hi)}"
    return f"> {_text.count(p.b_crit_lo)}" if p.b_crit_lo is not None else _text.DASH


def table(branches: RunBranches, forecast: ForecastReport | None) -> pd.DataFrame:
    """The branch points as a table: what was measured, and why not where it was not."""
    rows = []
    for p in branches.points:
        at = _forecast_at(forecast, p.parent_loss)
        rows.append(
            {
                "step": p.step,
                "parent loss": _text.loss(p.parent_loss),
                "local B_crit": _local_text(p),
                "90% interval": _open_interval(p.b_crit_lo, p.b_crit_hi)
                if p.b_crit is not None or p.b_crit_hi is not None
                else "",
                "sweep B_crit at this loss": _text.DASH
                if at is None
                else _text.count(at.b_crit) + (" (extrapolated)" if at.extrapolation else ""),
                "batch sizes": ", ".join(_text.count(b) for b in p.batch_sizes),
                "seeds": p.seeds,
                "ε": p.epsilon,
                "note": p.reason or "",
            }
        )
    return pd.DataFrame(rows)


def chart(b_simple: pd.DataFrame, measured: pd.DataFrame, *, units: str) -> alt.LayerChart:
    """B_simple's line and band over steps, the branch and sweep measurements as points with
    interval rules; log-log, one y axis (batch size in ``units``)."""
    line = b_simple.dropna(subset=["value"])
    line = line[(line["value"] > 0) & (line["step"] > 0)]
    band = line.dropna(subset=["lo", "hi"])
    band = band[band["lo"] > 0]
    pts = measured[(measured["value"] > 0) & (measured["step"] > 0)].copy()
    values = [*line["value"], *pts["value"], *pts["lo"].dropna(), *pts["hi"].dropna()]
    y_lo, y_hi = log_extent(values, 2.0)
    pts["lo_shown"], pts["hi_shown"] = interval_ends(pts["lo"], pts["hi"], y_lo, y_hi)
    x = alt.X("step:Q", scale=alt.Scale(type="log"), title="step")
    scale = alt.Scale(type="log", domain=[y_lo, y_hi], nice=False, clamp=True)
    y = alt.Y("value:Q", scale=scale, title=f"batch size ({_text.units_word(units)})")
    shown = [q for q in _COLORS if q == B_SIMPLE or q in set(pts["quantity"])]
    color = alt.Color(
        "quantity:N",
        title=None,
        scale=alt.Scale(domain=shown, range=[_COLORS[q] for q in shown]),
        legend=alt.Legend(orient="bottom", direction="vertical", labelLimit=0),
    )
    layers: list[Any] = []
    if not band.empty:
        layers.append(
            alt.Chart(band)
            .mark_area(opacity=0.2, color=_COLORS[B_SIMPLE])
            .encode(x=x, y=alt.Y("lo:Q", scale=scale), y2="hi:Q")
        )
    if not line.empty:
        layers.append(
            alt.Chart(line.assign(quantity=B_SIMPLE)).mark_line().encode(x=x, y=y, color=color)
        )
    if not pts.empty:
        tip = [
            alt.Tooltip("quantity:N", title=" "),
            alt.Tooltip("step:Q", title="step"),
            alt.Tooltip("value:Q", title="value", format=",.3~g"),
            alt.Tooltip("interval:N", title="90% interval"),
        ]
        layers.append(interval_rule(pts, x, scale, color))
        layers.append(
            alt.Chart(pts)
            .mark_point(filled=True, size=80)
            .encode(x=x, y=y, color=color, shape=alt.Shape("quantity:N", legend=None), tooltip=tip)
        )
    if not layers:
        layers.append(alt.Chart(pd.DataFrame({"step": []})).mark_point())
    return cast(
        alt.LayerChart,
        alt.layer(*layers).properties(width="container", height=320, description=TITLE),
    )
