"""What the Compare runs and Compare tasks pages share: B_simple against loss and progress.

Each run is bucketed in SQL to ``POINTS_PER_RUN`` points (100 runs stay far below the
browser budget), smoothed over the same fraction of its length, and drawn one colour per task
(or run) with a legend that highlights on click.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from noisescope_dashboard import _charts, _data, _model, _state
from noisescope_dashboard._ui import chart_with_downloads

__all__ = ["POINTS_PER_RUN", "compare_view", "task_summary"]

POINTS_PER_RUN = 400
#: A run with this many 64-sample blocks is read from the block table (coarser, much faster).
MIN_BLOCKS = 100


def task_summary(runs: pd.DataFrame, smoothed: pd.DataFrame) -> pd.DataFrame:
    """One row per task: runs, batch sizes, best loss, current B_simple (median and range)."""
    rows = []
    for (project, task), group in runs.groupby(["project", "task"], sort=True):
        series = smoothed[smoothed["run"].isin(group["uid"])]
        b_now = group["b_simple"].dropna().astype(float)
        rows.append(
            {
                "project": str(project),
                "task": str(task),
                "runs": len(group),
                "batch sizes": ", ".join(
                    _model.format_batch(float(b))
                    for b in sorted(group["batch_size"].dropna().unique())
                ),
                "units": ", ".join(sorted(group["units"].astype(str).unique())),
                "best loss": float(series["loss"].min()) if series["loss"].notna().any() else None,
                "B_simple (median, latest)": float(b_now.median()) if not b_now.empty else None,
                "B_simple min": float(b_now.min()) if not b_now.empty else None,
                "B_simple max": float(b_now.max()) if not b_now.empty else None,
            }
        )
    return pd.DataFrame(rows)


def compare_view(url: str, chosen: pd.DataFrame, *, color: str, key: str) -> pd.DataFrame:
    """Controls and the two charts for the runs in ``chosen``; returns the smoothed frame."""
    c1, c2, c3 = st.columns(3)
    progress_x = _state.select(
        "Progress axis",
        ["progress", "step", "examples"],
        key="px",
        format_func=lambda v: {
            "progress": "fraction of the run",
            "step": "step",
            "examples": "examples or tokens seen",
        }[v],
        container=c1,
    )
    frac = c2.number_input(
        "Smoothing window (fraction of each run)",
        min_value=0.0,
        max_value=1.0,
        value=0.1,
        step=0.05,
        key="win",
        bind="query-params",
    )
    log_x = c3.checkbox("log x (progress)", value=False, key="logx", bind="query-params")
    series = _data.runs_series(url, tuple(chosen["uid"]), ("",), POINTS_PER_RUN, MIN_BLOCKS)
    if series.empty:
        st.info("These runs have no samples yet; they appear once training loops post them.")
        return series
    smoothed = _model.smooth_groups(
        series, method="window", window_frac=float(frac), interval=False
    )
    meta = chosen.set_index("uid")
    smoothed["task"] = smoothed["run"].map(
        lambda u: f"{meta.at[u, 'project']}/{meta.at[u, 'task']}"
    )
    smoothed["run_name"] = smoothed["run"].map(lambda u: str(meta.at[u, "name"]))
    csv_cols = ["task", "run", "run_name", "step", "examples", "progress", "loss", "b_simple"]
    csv_cols += ["b_simple_lo", "b_simple_hi"]
    left, right = st.columns(2)
    with left:
        chart_with_downloads(
            _charts.compare_chart(
                smoothed,
                x="loss",
                color=color,
                detail="run",
                reverse_x=True,
                title="B_simple against loss (loss falls to the right)",
            ),
            smoothed[csv_cols],
            name=f"{key}_b_simple_vs_loss",
            key=f"{key}_loss",
        )
    with right:
        chart_with_downloads(
            _charts.compare_chart(
                smoothed,
                x=str(progress_x),
                color=color,
                detail="run",
                log_x=log_x,
                title="B_simple against training progress",
            ),
            smoothed[csv_cols],
            name=f"{key}_b_simple_vs_progress",
            key=f"{key}_progress",
        )
    return smoothed
