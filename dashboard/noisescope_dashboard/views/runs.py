"""Runs page: every run with its current B_simple, interval, batch in use and B / B_simple.

Filters, search and sort live in the query string. While any run is active the table is a
fragment that re-reads the database every few seconds without rerunning the page.
"""

from __future__ import annotations

from datetime import timedelta

import pandas as pd
import streamlit as st

from noisescope_dashboard import _data, _state
from noisescope_dashboard._model import format_batch
from noisescope_dashboard._ui import require_runs, run_label

#: How often the table refreshes while some run is still running.
LIVE_EVERY = timedelta(seconds=5)

SORTS = {
    "started": ("started_at", False),
    "name": ("name", True),
    "b_simple": ("b_simple", False),
    "ratio": ("ratio", True),
    "loss": ("loss", True),
}

st.title("Runs")
url, runs = require_runs()

f1, f2, f3, f4 = st.columns(4)
projects = f1.multiselect(
    "Project", sorted(runs["project"].unique()), key="project", bind="query-params"
)
tasks = f2.multiselect(
    "Task",
    sorted(
        runs[runs["project"].isin(projects)]["task"].unique() if projects else runs["task"].unique()
    ),
    key="task",
    bind="query-params",
)
all_tags = sorted({str(t) for tags in runs["tags"] for t in (tags or [])})
tags = f3.multiselect("Tag", all_tags, key="tag", bind="query-params")
statuses = f4.multiselect(
    "Status", sorted(runs["status"].unique()), key="status", bind="query-params"
)
s1, s2, s3 = st.columns([3, 1, 1])
search = s1.text_input(
    "Search names, tasks, tags and config", key="q", bind="query-params", placeholder="e.g. lr=0.1"
)
sort = _state.select(
    "Sort by",
    list(SORTS),
    key="sort",
    format_func=lambda s: {
        "started": "newest first",
        "name": "name",
        "b_simple": "B_simple (largest first)",
        "ratio": "B / B_simple",
        "loss": "loss",
    }[s],
    container=s2,
)
live_default = bool((runs["status"] == "running").any())
live = s3.toggle(
    "Live", value=live_default, key="live", help="Refresh every 5 s while runs are active"
)


def _filtered(frame: pd.DataFrame) -> pd.DataFrame:
    out = frame
    if projects:
        out = out[out["project"].isin(projects)]
    if tasks:
        out = out[out["task"].isin(tasks)]
    if statuses:
        out = out[out["status"].isin(statuses)]
    if tags:
        out = out[[bool(set(tags) & {str(t) for t in (ts or [])}) for ts in out["tags"]]]
    if search:
        needle = search.lower()
        haystack = (
            out["name"].astype(str)
            + " "
            + out["project"].astype(str)
            + " "
            + out["task"].astype(str)
            + " "
            + out["tags"].astype(str)
            + " "
            + out["config"].map(lambda c: " ".join(f"{k}={v}" for k, v in (c or {}).items()))
        )
        out = out[haystack.str.lower().str.contains(needle, regex=False)]
    return out


def _table(frame: pd.DataFrame) -> pd.DataFrame:
    batch = frame["batch_in_use"].fillna(frame["batch_size"]).astype(float)
    b = frame["b_simple"].astype(float)
    interval = [
        f"{format_batch(lo)} – {format_batch(hi)}" if pd.notna(lo) and pd.notna(hi) else ""
        for lo, hi in zip(frame["b_simple_lo"], frame["b_simple_hi"], strict=True)
    ]
    table = pd.DataFrame(
        {
            "uid": frame["uid"],
            "name": frame["name"].astype(str),
            "project": frame["project"].astype(str),
            "task": frame["task"].astype(str),
            "status": frame["status"].astype(str),
            "tags": [", ".join(str(t) for t in (ts or [])) for ts in frame["tags"]],
            "batch": batch,
            "b_simple": b,
            "interval": interval,
            "ratio": batch / b,
            "loss": frame["loss"].astype(float),
            "step": frame["last_step"],
            "units": frame["units"].astype(str),
            "started_at": frame["started_at"],
        }
    )
    column, ascending = SORTS[str(sort)]
    column = {"started_at": "started_at"}.get(column, column)
    return table.sort_values(column, ascending=ascending, na_position="last").reset_index(drop=True)


@st.fragment(run_every=LIVE_EVERY if live else None)
def runs_table() -> None:
    frame = _data.list_runs(url) if live else runs
    shown = _table(_filtered(frame))
    st.caption(f"{len(shown)} of {len(frame)} runs" + (" · live" if live else ""))
    if shown.empty:
        st.info("No run matches these filters. Clear the search or the filters above.")
        return
    event = st.dataframe(
        shown,
        hide_index=True,
        width="stretch",
        on_select="rerun",
        selection_mode="single-row",
        key="runs_table",
        column_order=[
            "name",
            "project",
            "task",
            "status",
            "tags",
            "batch",
            "b_simple",
            "interval",
            "ratio",
            "loss",
            "step",
            "started_at",
        ],
        column_config={
            "name": st.column_config.TextColumn("Run"),
            "batch": st.column_config.NumberColumn("Batch in use", format="%.4g"),
            "b_simple": st.column_config.NumberColumn(
                "B_simple", format="%.4g", help="Over the last 10% of the run's steps"
            ),
            "interval": st.column_config.TextColumn("90% interval"),
            "ratio": st.column_config.NumberColumn(
                "B / B_simple", format="%.2f", help="Below 1: a bigger batch would cut steps"
            ),
            "loss": st.column_config.NumberColumn("Loss", format="%.4g"),
            "step": st.column_config.NumberColumn("Step", format="%d"),
            "started_at": st.column_config.DatetimeColumn("Started", format="YYYY-MM-DD HH:mm"),
        },
    )
    rows = event.selection.rows if event is not None else []
    if rows:
        row = shown.iloc[rows[0]]
        label = run_label(row)
        st.page_link(
            "views/run.py",
            label=f"Open {label}",
            icon=":material/show_chart:",
            query_params={"run": str(row["uid"])},
        )
    else:
        st.caption("Select a row to open the run.")


runs_table()
