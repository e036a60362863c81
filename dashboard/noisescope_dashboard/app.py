"""noisescope's dashboard: ``noisescope dashboard --url URL`` (or ``streamlit run app.py`` with
NOISESCOPE_URL set). It reads the server's HTTP API only (``_data``), never a database.

Multipage through ``st.Page`` + ``st.navigation``; each page keeps its state (run, task,
filters, axis choices) in the query string, so a URL shared is the view seen.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

_HERE = Path(__file__).parent

#: The tab icon, inline: a Material icon name would make the browser fetch it from Google's
#: font servers, and nothing the dashboard shows may leave this machine.
ICON = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24"><path d="M2 19C7 19 8 5 12 5'
    's5 14 10 14" fill="none" stroke="#1f77b4" stroke-width="2.6" stroke-linecap="round"/>'
    '<circle cx="12" cy="5" r="2.2" fill="#d62728"/></svg>'
)

st.set_page_config(page_title="noisescope", page_icon=ICON, layout="wide")

RUNS = _HERE / "views/runs.py"

PAGES = [
    # Streamlit serves the default page at "/" only; the hidden twin below answers "/runs".
    st.Page(RUNS, title="Runs", icon=":material/list:", url_path="home", default=True),
    st.Page(RUNS, title="Runs", icon=":material/list:", url_path="runs", visibility="hidden"),
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

st.navigation(PAGES, position="top").run()
