"""noisescope's dashboard: ``streamlit run app.py`` with NOISESCOPE_DATABASE_URL set.

Multipage through ``st.Page`` + ``st.navigation``; each page keeps its state (run, task,
filters, axis choices) in the query string, so a URL shared is the view seen.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

_HERE = Path(__file__).parent

st.set_page_config(page_title="noisescope", page_icon=":material/blur_on:", layout="wide")

PAGES = [
    st.Page(
        _HERE / "views/runs.py", title="Runs", icon=":material/list:", url_path="runs", default=True
    ),
    st.Page(_HERE / "views/run.py", title="Run", icon=":material/show_chart:", url_path="run"),
    st.Page(
        _HERE / "views/compare_runs.py",
        title="Compare runs",
        icon=":material/compare_arrows:",
        url_path="compare-runs",
    ),
    st.Page(
        _HERE / "views/compare_tasks.py",
        title="Compare tasks",
        icon=":material/stacked_line_chart:",
        url_path="compare-tasks",
    ),
    st.Page(
        _HERE / "views/critical_batch.py",
        title="Critical batch size",
        icon=":material/functions:",
        url_path="critical-batch",
    ),
    st.Page(
        _HERE / "views/what_if.py", title="What-if", icon=":material/tune:", url_path="what-if"
    ),
]

st.navigation(PAGES).run()
