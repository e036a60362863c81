"""Critical batch size: fit science.md's S-E model to a task's batch-size sweep, per loss target.

For each target, the steps and examples each run took to reach it; the fitted hyperbola
(S/S_min - 1)(E/E_min - 1) = 1 with S_min, E_min and B_crit = E_min / S_min; and B_crit
against loss beside B_simple measured at the same loss.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from noisescope_dashboard import _charts, _data, _model, _state
from noisescope_dashboard._ui import chart_with_downloads, md_text, require_runs

#: z for a two-sided 90% normal interval on B_crit from its delta-method standard error.
Z90 = 1.645

st.title("Critical batch size")
url, runs = require_runs()
runs = runs.assign(task_key=runs["project"].astype(str) + "/" + runs["task"].astype(str))
sizes_per_task = runs.groupby("task_key")["batch_size"].nunique().sort_values(ascending=False)
task = _state.select(
    "Task", list(sizes_per_task.index), key="task", default=str(sizes_per_task.index[0])
)
chosen = runs[runs["task_key"] == task]
units = str(chosen["units"].iloc[0] or "examples")
sizes = sorted(float(b) for b in chosen["batch_size"].dropna().unique())
st.caption(
    md_text(
        f"{len(chosen)} runs at {len(sizes)} batch sizes: "
        + ", ".join(_model.format_batch(b) for b in sizes)
    )
)
if len(sizes) < 3:
    st.warning(
        f"A fit needs runs of this task at 3 or more batch sizes; it has {len(sizes)}. "
        "Run the same task at several batch sizes (e.g. 4 sizes spanning 16x, each with its "
        "learning rate tuned), then come back."
    )
    st.stop()

series = _data.runs_series(url, tuple(chosen["uid"]), ("",), 1000)
smoothed = _model.smooth_groups(series, method="window", window_frac=0.05, interval=False)
defaults = _model.default_targets(smoothed)
targets_text = st.text_input(
    "Loss targets (comma separated)",
    value=", ".join(f"{t:g}" for t in defaults),
    key="targets",
    bind="query-params",
    help="Each target is the loss a run must reach; pick values every batch size reaches.",
)
targets: list[float] = []
bad: list[str] = []
for part in (targets_text or "").split(","):
    if part.strip():
        try:
            targets.append(float(part))
        except ValueError:
            bad.append(part.strip())
if bad:
    st.error(md_text(f"Not numbers: {', '.join(bad)}. Write targets like: 0.5, 0.3, 0.2"))
if not targets:
    st.info(
        "No loss target to fit: the runs have no loss logged, or none falls. Pass `loss=` "
        "to the probe (or `run.log`) and enter targets above."
    )
    st.stop()

crossings = _model.loss_crossings(smoothed, chosen, targets)
result = _model.critical_batch_analysis(crossings, targets)
for message in result.messages:
    st.warning(md_text(message))
if result.fits.empty:
    st.info("No loss target could be fitted yet; see the messages above.")
    st.stop()

fits = result.fits
show = pd.DataFrame(
    {
        "loss target": fits["target"],
        "S_min (steps)": fits["s_min"],
        f"E_min ({units})": fits["e_min"],
        "B_crit": fits["b_crit"],
        "B_crit 90% interval": [
            f"{_model.format_batch(max(b - Z90 * se, 0.0))} – {_model.format_batch(b + Z90 * se)}"
            if pd.notna(se)
            else ""
            for b, se in zip(fits["b_crit"], fits["b_crit_stderr"], strict=True)
        ],
        "runs": fits["n_points"],
    }
)
st.dataframe(
    show,
    hide_index=True,
    width="stretch",
    column_config={
        c: st.column_config.NumberColumn(c, format="%.4g")
        for c in ("loss target", "S_min (steps)", f"E_min ({units})", "B_crit")
    },
)
points = result.points[result.points["target"].isin(fits["target"])].copy()
points["target"] = points["target"].map(lambda t: f"{t:g}")
curves = result.curves.copy()
curves["target"] = curves["target"].map(lambda t: f"{t:g}")
left, right = st.columns(2)
with left:
    chart_with_downloads(
        _charts.sweep_chart(points, curves, units=units),
        points,
        name="steps_vs_examples",
        key="sweep",
    )
measured = (
    crossings.dropna(subset=["b_simple"])
    .groupby("target")["b_simple"]
    .agg(["median", "min", "max"])
    .reset_index()
)
versus = pd.concat(
    [
        pd.DataFrame(
            {
                "loss": fits["target"],
                "value": fits["b_crit"],
                "lo": (fits["b_crit"] - Z90 * fits["b_crit_stderr"]).clip(lower=0),
                "hi": fits["b_crit"] + Z90 * fits["b_crit_stderr"],
                "quantity": "B_crit (fit)",
            }
        ),
        pd.DataFrame(
            {
                "loss": measured["target"],
                "value": measured["median"],
                "lo": measured["min"],
                "hi": measured["max"],
                "quantity": "B_simple (measured, median over runs)",
            }
        ),
    ],
    ignore_index=True,
)
with right:
    chart_with_downloads(
        _charts.bcrit_vs_loss_chart(versus, units=units),
        versus,
        name="b_crit_vs_loss",
        key="bcrit",
    )
st.caption(
    "Model (science.md, McCandlish et al. 2018): S = S_min(1 + B_crit/B), "
    "E = E_min(1 + B/B_crit). At B = B_crit a run takes 2× the minimum steps and 2× the "
    "minimum examples. B_simple is expected to track B_crit within a small factor and may "
    "underestimate it early in training."
)
