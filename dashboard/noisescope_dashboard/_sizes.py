"""Compare runs by model size: each run's B_simple (with its band) and its branch-measured
local critical batch sizes (with their intervals) against loss or against examples (tokens)
seen, one colour per model size.

Loss is the axis Kaplan et al. (2020) and Merrill et al. (2025) compare model sizes on: a
small model and a large one reach a loss after very different numbers of steps or tokens, and
the critical batch size is a function of the loss reached. Pure frames and an Altair chart
from API answers (``RunSeries`` of ``GET /series``, ``RunBranches`` of ``GET
/runs/{id}/branches``); the caller draws one chart per unit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, cast

import altair as alt
import pandas as pd

from noisescope import RunBranches, RunSeries, RunSummary
from noisescope_dashboard import _text
from noisescope_dashboard._branches import BRACKET, LOCAL, LOWER, local_mark
from noisescope_dashboard._charts._axes import (
    SCHEME,
    TALL,
    XAxis,
    interval_ends,
    interval_rule,
    log_extent,
    scale_axis,
    wide_legend,
)

__all__ = [
    "BRACKET",
    "B_SIMPLE",
    "LOCAL",
    "LOWER",
    "SIZE_KEYS",
    "TITLE",
    "chart",
    "marks",
    "size_label",
]

TITLE = "Across model sizes: B_simple and the local critical batch size against loss"
#: The title on the examples (tokens) axis, with "examples" or "tokens".
TITLE_SEEN = "Across model sizes: B_simple and the local critical batch size against {} seen"
#: Config keys read for a run's model size, first found wins; else the run's name.
SIZE_KEYS = ("n_params", "model_size")
B_SIMPLE = "B_simple (90% band)"
_SHAPES = {LOCAL: "circle", LOWER: "triangle-up", BRACKET: "diamond"}
_COLUMNS = ["run", "size", "n_params", "units", "quantity", "loss", "examples", "value"]
_COLUMNS += ["lo", "hi", "step", "interval"]


def _n_params(run: RunSummary) -> float | None:
    value = run.config.get("n_params") if isinstance(run.config, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def size_label(run: RunSummary) -> str:
    """The run's model size as the legend names it: ``config["n_params"]`` as a parameter
    count ("125M params"), else ``config["model_size"]`` as given, else the run's name."""
    config = run.config if isinstance(run.config, dict) else {}
    n_params = _n_params(run)
    if n_params is not None:
        return f"{_text.count(n_params)} params"
    for key in SIZE_KEYS:
        value = config.get(key)
        if isinstance(value, int | float):  # bool included
            number = not isinstance(value, bool) and math.isfinite(value) and value > 0
            if key == "model_size" and number:
                return f"{value:g}"
            continue  # a number that is no size (negative, NaN, a flag)
        text = str(value).strip() if value is not None else ""
        if text:
            return text
    return run.name


def marks(
    runs: Sequence[RunSummary],
    series: Sequence[RunSeries],
    branches: Mapping[str, RunBranches],
) -> pd.DataFrame:
    """One row per drawn value: B_simple per bucket (at the bucket's training loss and its
    last examples) and the local B_crit per branch point (at the parent's evaluation loss at
    the branch step and the examples it had seen)."""
    by_uid = {r.uid: r for r in runs}
    rows: list[dict[str, Any]] = []
    for s in series:
        run = by_uid.get(s.run_uid)
        if run is None:
            continue
        base = {"run": run.uid, "size": size_label(run), "n_params": _n_params(run)}
        base["units"] = run.units
        for p in s.points:
            rows.append(
                base
                | {"quantity": B_SIMPLE, "loss": p.loss, "examples": p.examples_hi}
                | {"value": p.b_simple}
                | {"lo": p.b_simple_lo, "hi": p.b_simple_hi, "step": p.step_hi}
            )
    for uid, answer in branches.items():
        run = by_uid.get(uid)
        if run is None:
            continue
        base = {"run": run.uid, "size": size_label(run), "n_params": _n_params(run)}
        base["units"] = answer.units
        for b in answer.points:
            local = local_mark(b)
            if local is not None:
                at = {"loss": b.parent_loss, "examples": b.parent_examples, "step": b.step}
                rows.append(base | at | local)
    frame = pd.DataFrame(rows, columns=_COLUMNS)
    for c in ("n_params", "loss", "examples", "value", "lo", "hi"):
        frame[c] = pd.to_numeric(frame[c], errors="coerce").astype(float)
    return frame


def chart(
    frame: pd.DataFrame,
    *,
    units: str,
    x: str = "loss",
    title: str = TITLE,
    log_x: bool = False,
) -> alt.LayerChart:
    """B_simple's line and band per run, the branch points with interval rules (an open upper
    end drawn to the top), x = ``loss`` (falling to the right) or ``examples`` (seen), y =
    batch size in ``units`` (log);
    one colour per model size, one line per run."""
    frame = frame[frame["units"] == units]
    ok = frame.dropna(subset=[x, "value"])
    ok = ok[(ok["value"] > 0) & (ok[x] > 0 if log_x else ok[x].notna())]
    curve = ok[ok["quantity"] == B_SIMPLE]
    band = curve.dropna(subset=["lo", "hi"])
    band = band[band["lo"] > 0]
    pts = ok[ok["quantity"] != B_SIMPLE].copy()
    values = [*ok["value"], *band["lo"], *band["hi"], *pts["lo"].dropna(), *pts["hi"].dropna()]
    y_lo, y_hi = log_extent(values, 1.5)
    pts["lo_shown"], pts["hi_shown"] = interval_ends(pts["lo"], pts["hi"], y_lo, y_hi)
    x_title = "loss (falls to the right)" if x == "loss" else f"{_text.units_word(units)} seen"
    x_enc = XAxis(x, x_title, log=log_x, reverse=x == "loss").encoding(list(ok[x]))
    y_scale, y_axis = scale_axis([y_lo, y_hi], True, clamp=True)
    y_title = f"batch size ({_text.units_word(units)})"
    y = alt.Y("value:Q", title=y_title, scale=y_scale, axis=y_axis)
    # smallest model first where the runs give n_params, then by name
    order = ok.groupby("size")["n_params"].min()
    sizes = sorted(order.index, key=lambda k: (math.isnan(order[k]), order[k], str(k)))
    size_scale = alt.Scale(domain=sizes, scheme=SCHEME)
    color = alt.Color(
        "size:N",
        title="model size",
        scale=size_scale,
        legend=wide_legend(),
    )
    layers: list[Any] = []
    if not band.empty:
        layers.append(
            alt.Chart(band)
            .mark_area(opacity=0.15)
            .encode(
                x=x_enc,
                y=alt.Y("lo:Q", scale=y_scale),
                y2="hi:Q",
                color=color,
                detail="run:N",
            )
        )
    if not curve.empty:
        layers.append(
            alt.Chart(curve)
            .mark_line(strokeWidth=2)
            .encode(x=x_enc, y=y, color=color, detail="run:N", order="step:Q")
        )
    if not pts.empty:
        tip = [
            alt.Tooltip("size:N", title="model size"),
            alt.Tooltip("quantity:N", title=" "),
            alt.Tooltip("step:Q", title="branch step"),
            alt.Tooltip("loss:Q", title="parent's eval loss", format=",.4~r"),
            alt.Tooltip("examples:Q", title=f"parent's {_text.units_word(units)}", format=",~r"),
            alt.Tooltip("value:Q", title="local B_crit", format=",.3~g"),
            alt.Tooltip("interval:N", title="90% interval"),
        ]
        shown = [q for q in _SHAPES if q in set(pts["quantity"])]
        layers.append(interval_rule(pts, x_enc, y_scale, color))
        layers.append(
            alt.Chart(pts)
            .mark_point(filled=True, size=90, stroke="black", strokeWidth=0.5)
            .encode(
                x=x_enc,
                y=y,
                color=color,
                shape=alt.Shape(
                    "quantity:N",
                    title=None,
                    scale=alt.Scale(domain=shown, range=[_SHAPES[q] for q in shown]),
                    legend=alt.Legend(orient="bottom", labelLimit=0),
                ),
                tooltip=tip,
            )
        )
    if not layers:
        layers.append(alt.Chart(pd.DataFrame({x: []})).mark_point())
    return cast(
        alt.LayerChart,
        alt.layer(*layers).properties(width="container", height=TALL, description=title),
    )
