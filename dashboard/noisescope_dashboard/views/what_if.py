"""What-if: pick a task and a batch size (or GPUs × per-GPU batch); see predicted steps and
examples relative to the minimum on the time/compute trade-off curve (science.md's model)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from noisescope.estimators import examples_ratio, steps_ratio
from noisescope_dashboard import _charts, _data, _model, _state
from noisescope_dashboard._ui import chart_with_downloads, md_text, require_runs

st.title("What-if")
url, runs = require_runs()
runs = runs.assign(task_key=runs["project"].astype(str) + "/" + runs["task"].astype(str))
tasks = sorted(runs["task_key"].unique())
task = _state.select("Task", tasks, key="task")
chosen = runs[runs["task_key"] == task]
units = str(chosen["units"].iloc[0] or "examples")

# Where B_crit comes from: a sweep fit when the task has one, else B_simple as its estimate.
sources: dict[str, tuple[float, float | None, float | None]] = {}
if chosen["batch_size"].nunique() >= 3:
    series = _data.runs_series(url, tuple(chosen["uid"]), ("",), 1000)
    smoothed = _model.smooth_groups(series, method="window", window_frac=0.05, interval=False)
    targets = _model.default_targets(smoothed)
    result = _model.critical_batch_analysis(
        _model.loss_crossings(smoothed, chosen, targets), targets
    )
    for _, fit in result.fits.iterrows():
        sources[f"B_crit fitted at loss {fit['target']:g}"] = (
            float(fit["b_crit"]),
            float(fit["s_min"]),
            float(fit["e_min"]),
        )
b_simple_now = chosen["b_simple"].dropna()
if not b_simple_now.empty:
    sources["B_simple now (median over the task's runs)"] = (
        float(b_simple_now.median()),
        None,
        None,
    )
if not sources:
    st.info(
        "This task has neither a batch-size sweep to fit nor a measurable B_simple yet. Let a "
        "run train longer (B_simple needs enough steps) or run the task at 3+ batch sizes."
    )
    st.stop()
source = _state.select("Critical batch size from", list(sources), key="source")
b_crit, s_min, e_min = sources[str(source)]
st.caption(f"B_crit = {_model.format_batch(b_crit)} {md_text(units)}")

mode = _state.select(
    "Batch",
    ["batch", "gpus"],
    key="mode",
    widget="radio",
    horizontal=True,
    format_func=lambda m: {"batch": "batch size", "gpus": "GPUs × per-GPU batch"}[m],
)
in_use = chosen["batch_in_use"].dropna()
default_batch = int(in_use.median()) if not in_use.empty else int(max(b_crit, 1))
if mode == "gpus":
    g1, g2 = st.columns(2)
    gpus = g1.number_input("GPUs", min_value=1, value=8, step=1, key="gpus", bind="query-params")
    per_gpu = g2.number_input(
        f"Per-GPU batch ({units})",
        min_value=1,
        value=max(1, default_batch // 8),
        step=1,
        key="per_gpu",
        bind="query-params",
    )
    batch = float(gpus * per_gpu)
else:
    batch = float(
        st.number_input(
            f"Batch size ({units})",
            min_value=1,
            value=default_batch,
            step=1,
            key="b",
            bind="query-params",
        )
    )

s_ratio = steps_ratio(batch, b_crit)
e_ratio = examples_ratio(batch, b_crit)
m1, m2, m3 = st.columns(3)
m1.metric("Batch", _model.format_batch(batch), help=f"{batch / b_crit:.2g}× B_crit")
m2.metric(
    "Steps / minimum",
    f"{s_ratio:.2f}×",
    help="S / S_min = 1 + B_crit / B",
)
m3.metric(f"{units.capitalize()} / minimum", f"{e_ratio:.2f}×", help="E / E_min = 1 + B / B_crit")
if s_min is not None and e_min is not None:
    st.write(
        f"To reach the loss target: about **{s_min * s_ratio:,.0f} steps** and "
        f"**{e_min * e_ratio:,.3g} {md_text(units)}** at batch {_model.format_batch(batch)}."
    )
st.info(_model.verdict(batch, b_crit, units=units, reference="B_crit"))

curve = _model.tradeoff_curve(b_crit, lo=min(batch, b_crit) / 20, hi=max(batch, b_crit) * 20)
point = pd.DataFrame(
    {
        "batch_size": [batch],
        "steps_ratio": [s_ratio],
        "examples_ratio": [e_ratio],
        "label": [f"batch {_model.format_batch(batch)}"],
    }
)
chart_with_downloads(
    _charts.tradeoff_chart(curve, point, units=units),
    pd.concat([curve.assign(chosen=False), point.drop(columns="label").assign(chosen=True)]),
    name="tradeoff",
    key="tradeoff",
)
