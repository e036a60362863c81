"""Compare runs: several runs side by side, B_simple against loss and against progress."""

from __future__ import annotations

import streamlit as st

from noisescope_dashboard import _state
from noisescope_dashboard._compare import compare_view, task_summary
from noisescope_dashboard._ui import require_runs, run_label

st.title("Compare runs")
url, runs = require_runs()
labels = {str(r["uid"]): run_label(r) for _, r in runs.iterrows()}
chosen_uids = _state.multiselect(
    "Runs",
    list(labels),
    key="runs",
    default=list(labels)[:5],
    format_func=lambda u: labels.get(u, u),
)
if not chosen_uids:
    st.info("Pick two or more runs above to compare their noise scales.")
    st.stop()
color = _state.select(
    "Colour by",
    ["run_name", "task"],
    key="color",
    format_func=lambda c: {"run_name": "run", "task": "task"}[c],
    widget="radio",
    horizontal=True,
)
chosen = runs[runs["uid"].isin(chosen_uids)]
smoothed = compare_view(url, chosen, color=str(color), key="runs")
st.subheader("Per task")
st.dataframe(
    task_summary(chosen, smoothed),
    hide_index=True,
    width="stretch",
    column_config={
        c: st.column_config.NumberColumn(c, format="%.4g")
        for c in ("best loss", "B_simple (median, latest)", "B_simple min", "B_simple max")
    },
)
