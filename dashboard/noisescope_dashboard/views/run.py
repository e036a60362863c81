"""Run page: |G|², tr(Σ), B_simple with its interval, loss and lr for one run, and a verdict.

State (run, x axis, smoothing, log scales, layers) lives in the query string.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from noisescope_dashboard import _charts, _data, _model, _state
from noisescope_dashboard._ui import chart_with_downloads, md_text, require_runs, run_label

st.title("Run")
url, runs = require_runs()
labels = {str(r["uid"]): run_label(r) for _, r in runs.iterrows()}
uid = _state.select("Run", list(labels), key="run", format_func=lambda u: labels.get(u, u))
if uid is None:
    st.info("Pick a run above, or open one from the Runs page.")
    st.stop()
run = runs[runs["uid"] == uid].iloc[0]
units = str(run["units"] or "examples")

c1, c2, c3, c4, c5 = st.columns([1.2, 1, 1, 1, 1])
x_choice = _state.select(
    "x axis",
    ["step", "seen", "time"],
    format_func=lambda v: {"step": "step", "seen": units, "time": "wall time"}[v],
    horizontal=True,
    key="x",
    widget="radio",
    container=c1,
)
method = _state.select(
    "Smoothing",
    ["window", "ema", "none"],
    format_func=lambda v: {
        "window": "window (sums)",
        "ema": "EMA (debiased)",
        "none": "none (buckets)",
    }[v],
    key="smooth",
    container=c2,
)
last_step = float(run["last_step"]) if pd.notna(run["last_step"]) else 0.0
window = c3.number_input(
    "Window (steps)",
    min_value=1,
    value=max(1, int(last_step // 20) or 1),
    step=10,
    key="window",
    bind="query-params",
    disabled=method != "window",
)
beta = _state.select(
    "EMA beta (per step)",
    [0.9, 0.98, 0.99, 0.995, 0.999],
    default=0.99,
    key="beta",
    container=c4,
    disabled=method != "ema",
)
with c5:
    log_y = st.checkbox("log y", value=True, key="logy", bind="query-params")
    log_x = st.checkbox("log x", value=False, key="logx", bind="query-params")

names = _data.series_names(url, uid)
layers = [n for n in names if n != ""]
x = {"step": "step", "seen": "tokens" if units == "tokens" else "examples", "time": "time"}[
    str(x_choice)
]

st.subheader(md_text(run["name"]))
tags = ", ".join(str(t) for t in (run["tags"] or []))
st.caption(
    md_text(f"{run['project']} / {run['task']} · status {run['status']} · units {units}")
    + (" · tags: " + md_text(tags) if tags else "")
)
with st.expander("Config"):
    st.json(run["config"] or {})
st.download_button(
    "Raw samples (CSV)",
    data=lambda: _data.raw_samples_csv(url, str(uid)),
    file_name=f"noisescope_{uid}.csv",
    mime="text/csv",
    on_click="ignore",
    icon=":material/table:",
    help="Every sample of this run as stored, for your own analysis",
)

series = _data.runs_series(url, (uid,), ("", *tuple(layers)))
if series.empty or not (series["series"] == "").any():
    st.info(
        "This run has no samples yet. Samples appear a few seconds after the training loop "
        "calls the probe; if they never do, check the client's log for the server URL."
    )
    st.stop()
smoothed = _model.smooth_groups(
    series, method=str(method), window_steps=float(window), beta=float(beta or 0.99)
)
if units == "tokens":
    smoothed["tokens"] = smoothed["examples"]
whole = smoothed[smoothed["series"] == ""].reset_index(drop=True)
events = _model.place_events(_data.run_events(url, uid), whole, x)

current = whole.dropna(subset=["b_simple"]).tail(1)
b_now = float(current["b_simple"].iloc[0]) if not current.empty else None
batch_now = (
    float(whole["batch_size"].dropna().iloc[-1]) if whole["batch_size"].notna().any() else None
)
m1, m2, m3, m4 = st.columns(4)
if b_now is not None:
    lo, hi = current["b_simple_lo"].iloc[0], current["b_simple_hi"].iloc[0]
    m1.metric(
        "B_simple (latest window)",
        _model.format_batch(b_now),
        help="90% interval: "
        + (f"{lo:.4g} – {hi:.4g}" if pd.notna(lo) and pd.notna(hi) else "not available yet"),
    )
    if pd.notna(lo) and pd.notna(hi):
        m1.caption(f"90% interval {_model.format_batch(lo)} – {_model.format_batch(hi)}")
else:
    reason = whole["b_simple"].isna().all() and "not yet measurable"
    m1.metric("B_simple (latest window)", "—", help=str(reason))
m2.metric("Batch in use", _model.format_batch(batch_now) if batch_now else "—")
m3.metric("B / B_simple", f"{batch_now / b_now:.2g}×" if batch_now and b_now else "—")
loss_now = whole["loss"].dropna()
m4.metric("Loss", f"{loss_now.iloc[-1]:.4g}" if not loss_now.empty else "—")
if batch_now:
    st.info(_model.verdict(batch_now, b_now, units=units))
if b_now is None:
    st.warning(
        "B_simple is not yet measurable over the latest window: the |G|² estimate is not "
        "positive or tr(Σ) is negative. Widen the smoothing window or wait for more steps."
    )

csv_cols = ["step", "examples", "time", "n", "sum_g_sq", "sum_trace_sigma", "g_sq", "trace_sigma"]
csv_cols += ["b_simple", "b_simple_lo", "b_simple_hi", "batch_size", "loss", "lr"]
slug = str(uid)[:8]
chart_with_downloads(
    _charts.b_simple_chart(whole, x=x, log_y=log_y, log_x=log_x, events=events),
    whole[csv_cols],
    name=f"b_simple_{slug}",
    key="b_simple",
)


def metric_panel(y: str, title: str, y_title: str | None = None) -> None:
    """One smoothed metric over ``x`` with its PNG/CSV downloads (the CSV keeps the step)."""
    chart_with_downloads(
        _charts.metric_chart(
            whole,
            x=x,
            y=y,
            title=title,
            y_title=y_title,
            log_y=log_y,
            log_x=log_x,
            events=events,
        ),
        whole[list(dict.fromkeys(["step", x, y]))],
        name=f"{y}_{slug}",
        key=y,
    )


left, right = st.columns(2)
with left:
    metric_panel("g_sq", "|G|²: true-gradient norm² (unbiased)", "|G|²")
with right:
    metric_panel("trace_sigma", "tr(Σ): per-example gradient noise", "tr(Σ)")
left, right = st.columns(2)
with left:
    if whole["loss"].notna().any():
        metric_panel("loss", "Loss")
    else:
        st.caption("No loss logged: pass `loss=` to the probe or `run.log()` to see it here.")
with right:
    if whole["lr"].notna().any():
        metric_panel("lr", "Learning rate")
    else:
        st.caption("No learning rate logged: pass `lr=` to see it here.")

if layers:
    st.subheader("Per layer")
    chosen = st.multiselect("Layers", layers, default=layers[:8], key="layers", bind="query-params")
    per_layer = smoothed[smoothed["series"].isin(chosen)].rename(columns={"series": "layer"})
    if per_layer.empty:
        st.caption("Pick layers to compare their noise scales.")
    else:
        chart_with_downloads(
            _charts.b_simple_chart(
                per_layer,
                x=x,
                log_y=log_y,
                log_x=log_x,
                color="layer",
                batch_size=False,
                title="B_simple per layer",
            ),
            per_layer[["layer", "step", x, "b_simple", "b_simple_lo", "b_simple_hi"]]
            if x != "step"
            else per_layer[["layer", "step", "b_simple", "b_simple_lo", "b_simple_hi"]],
            name=f"b_simple_layers_{slug}",
            key="layers_chart",
        )
