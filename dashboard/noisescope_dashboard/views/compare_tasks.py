"""Compare tasks: every run of the chosen tasks, one colour per task, and a summary per task.

The paper's view: the noise scale grows as the loss falls, at very different levels per task.
"""

from __future__ import annotations

import streamlit as st

from noisescope_dashboard._compare import compare_view, task_summary
from noisescope_dashboard._ui import require_runs

st.title("Compare tasks")
url, runs = require_runs()
runs = runs.assign(task_key=runs["project"].astype(str) + "/" + runs["task"].astype(str))
all_tasks = sorted(runs["task_key"].unique())
tasks = st.multiselect(
    "Tasks (project/task)", all_tasks, default=all_tasks, key="tasks", bind="query-params"
)
if not tasks:
    st.info("Pick one or more tasks above.")
    st.stop()
chosen = runs[runs["task_key"].isin(tasks)]
smoothed = compare_view(url, chosen, color="task", key="tasks")
st.subheader("Summary per task")
summary = task_summary(chosen, smoothed)
st.dataframe(
    summary,
    hide_index=True,
    width="stretch",
    column_config={
        c: st.column_config.NumberColumn(c, format="%.4g")
        for c in ("best loss", "B_simple (median, latest)", "B_simple min", "B_simple max")
    },
)
st.download_button(
    "Summary CSV",
    summary.to_csv(index=False),
    file_name="task_summary.csv",
    mime="text/csv",
    on_click="ignore",
    icon=":material/download:",
)
