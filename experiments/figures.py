"""PNG figures (Altair + vl-convert, offline) for docs/reproduction.md."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import altair as alt
import pandas as pd

from experiments.analysis import b_simple_curve
from noisescope import sweep

__all__ = ["summary_chart", "task_chart"]

WIDTH = 300
HEIGHT = 240


def task_chart(
    title: str,
    units: str,
    report: sweep.CriticalBatchReport,
    best_runs: Sequence[sweep.SweepRun],
) -> alt.HConcatChart:
    """Three panels: the S-E trade-off, B_crit vs B_simple per target, B_simple along runs."""
    rows = report.targets
    level = f"{report.level:.0%}"
    pts = pd.DataFrame(
        [
            {
                "target": f"{r.target:g}",
                "steps": p.steps,
                "examples": p.examples,
                "batch": p.batch_size,
                "lr": p.lr,
            }
            for r in rows
            for p in r.points
        ]
    )
    fit_df = pd.DataFrame(
        [
            {"target": f"{r.target:g}", "steps": c.steps, "examples": c.examples}
            for r in rows
            if r.determined
            for c in r.curve
        ]
    )
    order = [f"{r.target:g}" for r in rows]
    color = alt.Color("target:N", sort=order, title="loss target")
    base_x = alt.X("examples:Q", scale=alt.Scale(type="log"), title=f"{units} to target")
    base_y = alt.Y("steps:Q", scale=alt.Scale(type="log"), title="steps to target")
    tradeoff = (
        alt.Chart(pts)
        .mark_point(filled=True, size=50)
        .encode(
            x=base_x,
            y=base_y,
            color=color,
            tooltip=["target:N", "batch:Q", "lr:Q", "steps:Q", "examples:Q"],
        )
    )
    if not fit_df.empty:
        tradeoff = (
            alt.Chart(fit_df).mark_line(strokeDash=[4, 3]).encode(x=base_x, y=base_y, color=color)
            + tradeoff
        )
    tradeoff = tradeoff.properties(
        width=WIDTH, height=HEIGHT, title="steps vs data to reach each loss (frontier)"
    )

    crit = []
    for r in rows:
        if r.determined and r.b_crit is not None:
            crit.append(
                {
                    "loss": r.target,
                    "value": r.b_crit,
                    "lo": r.b_crit_lo,
                    "hi": r.b_crit_hi,
                    "what": f"B_crit (sweep fit, {level} interval)",
                }
            )
        if r.b_simple is not None:
            crit.append(
                {
                    "loss": r.target,
                    "value": r.b_simple,
                    "lo": r.b_simple_lo,
                    "hi": r.b_simple_hi,
                    "what": f"B_simple (frontier runs, {level} interval)",
                }
            )
    crit_df = pd.DataFrame(crit)
    if crit_df.empty:
        y_scale = alt.Scale(type="log")
    else:
        y_lo, y_hi = crit_df["value"].min() / 4, crit_df["value"].max() * 4
        y_scale = alt.Scale(type="log", domain=[y_lo, y_hi], nice=False)
        # An interval reaching 0 (or past the chart) is drawn to the chart's edge.
        crit_df["lo"] = crit_df["lo"].clip(lower=y_lo)
        crit_df["hi"] = crit_df["hi"].clip(upper=y_hi)
    targets = [r.target for r in rows] or [1.0]
    loss_domain = [min(targets) / 1.15, max(targets) * 1.15]
    x_loss = alt.X(
        "loss:Q",
        scale=alt.Scale(type="log", reverse=True, domain=loss_domain, nice=False),
        title="loss target (falls →)",
    )
    what = alt.Color(
        "what:N",
        title=None,
        legend=alt.Legend(orient="bottom", direction="vertical", labelLimit=0),
    )
    if crit_df.empty:
        versus: alt.LayerChart | alt.Chart = alt.Chart(pd.DataFrame({"x": []})).mark_point()
    else:
        versus = alt.Chart(crit_df).mark_rule(clip=True).encode(
            x=x_loss, y=alt.Y("lo:Q", scale=y_scale), y2="hi:Q", color=what
        ) + alt.Chart(crit_df).mark_line(point=True, clip=True).encode(
            x=x_loss,
            y=alt.Y("value:Q", scale=y_scale, title=f"batch size ({units})"),
            color=what,
        )
    versus = versus.properties(width=WIDTH, height=HEIGHT, title="critical batch vs noise scale")

    curves = []
    curve_domain = [min(targets) / 1.15, max(targets) * 2.0]
    for run in best_runs:
        for _step, loss, b in b_simple_curve(run):
            inside = curve_domain[0] <= loss <= curve_domain[1]
            if b is not None and b > 0 and math.isfinite(loss) and inside:
                curves.append({"loss": loss, "b_simple": b, "run": f"B={run.batch_size:g}"})
    curve_df = pd.DataFrame(curves)
    if curve_df.empty:
        along: alt.Chart = alt.Chart(pd.DataFrame({"x": []})).mark_point()
    else:
        along = (
            alt.Chart(curve_df)
            .mark_line(opacity=0.8)
            .encode(
                x=alt.X(
                    "loss:Q",
                    scale=alt.Scale(type="log", reverse=True, domain=curve_domain, nice=False),
                    title="loss (falls →)",
                ),
                y=alt.Y("b_simple:Q", scale=alt.Scale(type="log"), title=f"B_simple ({units})"),
                color=alt.Color("run:N", sort=None, title="run"),
            )
        )
    along = along.properties(
        width=WIDTH, height=HEIGHT, title="B_simple during training (frontier run per B)"
    )
    chart: alt.HConcatChart = (
        alt.hconcat(tradeoff, versus, along)
        .resolve_scale(color="independent")
        .properties(title=title)
    )
    return chart


def summary_chart(points: Sequence[dict[str, Any]], level: float = 0.9) -> alt.LayerChart:
    """B_simple against fitted B_crit, both with their intervals, for every task and every
    target where B_crit is determined; guides at y = x and 3x either way."""
    columns = ["task", "target", "b_crit", "b_crit_lo", "b_crit_hi"]
    columns += ["b_simple", "b_simple_lo", "b_simple_hi"]
    df = pd.DataFrame(points, columns=columns)  # no point determined: empty axes, no error
    values = list(df["b_crit"]) + list(df["b_simple"]) if not df.empty else [1.0, 10.0]
    lo, hi = min(values) / 4, max(values) * 4
    if not df.empty:
        for col in ("b_crit_lo", "b_simple_lo"):
            df[col] = df[col].clip(lower=lo)
        for col in ("b_crit_hi", "b_simple_hi"):
            df[col] = df[col].clip(upper=hi)
    guide = pd.DataFrame(
        [
            {"x": lo, "y": lo * f, "line": name}
            for f, name in ((1, "B_simple = B_crit"), (3, "3×"), (1 / 3, "1/3×"))
        ]
        + [
            {"x": hi, "y": hi * f, "line": name}
            for f, name in ((1, "B_simple = B_crit"), (3, "3×"), (1 / 3, "1/3×"))
        ]
    )
    scale = alt.Scale(type="log", domain=[lo, hi])
    lines = (
        alt.Chart(guide)
        .mark_line(color="gray", strokeDash=[4, 3], clip=True)
        .encode(x=alt.X("x:Q", scale=scale), y=alt.Y("y:Q", scale=scale), detail="line:N")
    )
    dots = (
        alt.Chart(df)
        .mark_point(filled=True, size=70)
        .encode(
            x=alt.X("b_crit:Q", scale=scale, title="B_crit fitted from the sweep (task units)"),
            y=alt.Y("b_simple:Q", scale=scale, title="B_simple measured at that loss"),
            color=alt.Color("task:N"),
            shape=alt.Shape("task:N"),
            tooltip=["task:N", "target:Q", "b_crit:Q", "b_simple:Q"],
        )
    )
    x_bars = (
        alt.Chart(df)
        .mark_rule(clip=True)
        .encode(
            x=alt.X("b_crit_lo:Q", scale=scale),
            x2="b_crit_hi:Q",
            y=alt.Y("b_simple:Q", scale=scale),
            color=alt.Color("task:N"),
        )
    )
    y_bars = (
        alt.Chart(df)
        .mark_rule(clip=True, opacity=0.6)
        .encode(
            x=alt.X("b_crit:Q", scale=scale),
            y=alt.Y("b_simple_lo:Q", scale=scale),
            y2="b_simple_hi:Q",
            color=alt.Color("task:N"),
        )
    )
    chart: alt.LayerChart = (lines + x_bars + y_bars + dots).properties(
        width=380,
        height=340,
        title=f"Noise scale vs critical batch size ({level:.0%} intervals), all tasks",
    )
    return chart


def save_png(chart: alt.TopLevelMixin, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    chart.save(str(path), ppi=110)
