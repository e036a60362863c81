"""PNG figures (Altair + vl-convert, offline) for docs/reproduction.md."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import altair as alt
import pandas as pd

from experiments.analysis import CriticalBatchRow, SweepRun, noise_scale_curve

__all__ = ["summary_chart", "task_chart"]

#: Wider step window than the table's, only to make the along-the-run curves legible.
CURVE_WINDOW = 1.5
WIDTH = 300
HEIGHT = 240


def _hyperbola(row: CriticalBatchRow, b_lo: float, b_hi: float) -> list[dict[str, Any]]:
    """S = S_min(1 + B_crit/B), E = E_min(1 + B/B_crit) along a log grid of B."""
    if row.fit is None:
        return []
    fit = row.fit
    n = 40
    out = []
    for i in range(n + 1):
        b = b_lo * (b_hi / b_lo) ** (i / n)
        out.append(
            {
                "target": f"{row.target:g}",
                "steps": fit.s_min * (1 + fit.b_crit / b),
                "examples": fit.e_min * (1 + b / fit.b_crit),
            }
        )
    return out


def task_chart(
    title: str, units: str, rows: Sequence[CriticalBatchRow], best_runs: Sequence[SweepRun]
) -> alt.HConcatChart:
    """Three panels: the S-E trade-off, B_crit vs B_simple per target, B_simple along runs."""
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
    all_b = [p.batch_size for r in rows for p in r.points] or [1.0, 2.0]
    fit_df = pd.DataFrame([d for r in rows for d in _hyperbola(r, min(all_b) / 2, max(all_b) * 2)])
    order = [f"{r.target:g}" for r in rows]
    color = alt.Color("target:N", sort=order, title="loss target")
    base_x = alt.X("examples:Q", scale=alt.Scale(type="log"), title=f"{units} to target")
    base_y = alt.Y("steps:Q", scale=alt.Scale(type="log"), title="steps to target")
    tradeoff = (
        alt.Chart(pts)
        .mark_point(filled=True, size=50)
        .encode(
            x=base_x, y=base_y, color=color, tooltip=["target", "batch", "lr", "steps", "examples"]
        )
    )
    if not fit_df.empty:
        tradeoff = (
            alt.Chart(fit_df).mark_line(strokeDash=[4, 3]).encode(x=base_x, y=base_y, color=color)
            + tradeoff
        )
    tradeoff = tradeoff.properties(
        width=WIDTH, height=HEIGHT, title="steps vs data to reach each loss (best lr per B)"
    )

    crit = []
    for r in rows:
        if r.fit is not None:
            se = r.fit.b_crit_stderr or 0.0
            crit.append(
                {
                    "loss": r.target,
                    "value": r.fit.b_crit,
                    "lo": max(r.fit.b_crit - se, r.fit.b_crit / 10),
                    "hi": r.fit.b_crit + se,
                    "what": "B_crit (sweep fit ±1 s.e.)",
                }
            )
        if r.b_simple is not None:
            crit.append(
                {
                    "loss": r.target,
                    "value": r.b_simple,
                    "lo": min(r.b_simple_per_run.values()),
                    "hi": max(r.b_simple_per_run.values()),
                    "what": "B_simple (median, range over runs)",
                }
            )
    crit_df = pd.DataFrame(crit)
    y_scale = alt.Scale(type="log")
    targets = [r.target for r in rows] or [1.0]
    loss_domain = [min(targets) / 1.15, max(targets) * 1.15]
    x_loss = alt.X(
        "loss:Q",
        scale=alt.Scale(type="log", reverse=True, domain=loss_domain, nice=False),
        title="loss target (falls →)",
    )
    what = alt.Color("what:N", title=None, legend=alt.Legend(orient="bottom", direction="vertical"))
    if crit_df.empty:
        versus: alt.LayerChart | alt.Chart = alt.Chart(pd.DataFrame({"x": []})).mark_point()
    else:
        versus = alt.Chart(crit_df).mark_rule().encode(
            x=x_loss, y=alt.Y("lo:Q", scale=y_scale), y2="hi:Q", color=what
        ) + alt.Chart(crit_df).mark_line(point=True).encode(
            x=x_loss,
            y=alt.Y("value:Q", scale=y_scale, title=f"batch size ({units})"),
            color=what,
        )
    versus = versus.properties(width=WIDTH, height=HEIGHT, title="critical batch vs noise scale")

    curves = []
    curve_domain = [min(targets) / 1.15, max(targets) * 2.0]
    for run in best_runs:
        for _step, loss, b in noise_scale_curve(run, window=CURVE_WINDOW):
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
                y=alt.Y("b_simple:Q", scale=y_scale, title=f"B_simple ({units})"),
                color=alt.Color("run:N", sort=None, title="run"),
            )
        )
    along = along.properties(
        width=WIDTH, height=HEIGHT, title="B_simple during training (best run per B)"
    )
    chart: alt.HConcatChart = (
        alt.hconcat(tradeoff, versus, along)
        .resolve_scale(color="independent")
        .properties(title=title)
    )
    return chart


def summary_chart(points: Sequence[dict[str, Any]]) -> alt.LayerChart:
    """B_simple against fitted B_crit (±1 s.e. bars) for every task and target; y = x, 3×."""
    df = pd.DataFrame(points)
    values = list(df["b_crit"]) + list(df["b_simple"]) if not df.empty else [1.0, 10.0]
    lo, hi = min(values) / 4, max(values) * 4
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
            tooltip=["task", "target", "b_crit", "b_simple"],
        )
    )
    bars = (
        alt.Chart(df)
        .mark_rule(clip=True)
        .encode(
            x=alt.X("b_crit_lo:Q", scale=scale),
            x2="b_crit_hi:Q",
            y=alt.Y("b_simple:Q", scale=scale),
            color=alt.Color("task:N"),
        )
    )
    chart: alt.LayerChart = (lines + bars + dots).properties(
        width=380,
        height=340,
        title="Noise scale vs critical batch size (±1 s.e.), all tasks and targets",
    )
    return chart


def save_png(chart: alt.TopLevelMixin, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    chart.save(str(path), ppi=110)
