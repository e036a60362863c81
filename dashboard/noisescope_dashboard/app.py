"""noisescope's dashboard: ``noisescope dashboard --url URL`` (or ``streamlit run app.py`` with
NOISESCOPE_URL set). It reads the server's HTTP API only (``_data``), never a database.

Multipage through ``st.Page`` + ``st.navigation``; each page keeps its state (run, task,
filters, axis choices) in the query string, so a URL shared is the view seen.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import streamlit as st
from streamlit.navigation.page import StreamlitPage

_HERE = Path(__file__).parent

#: The tab icon, inline: a Material icon name would make the browser fetch it from Google's
#: font servers, and nothing the dashboard shows may leave this machine.
ICON = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24"><path d="M2 19C7 19 8 5 12 5'
    's5 14 10 14" fill="none" stroke="#1f77b4" stroke-width="2.6" stroke-linecap="round"/>'
    '<circle cx="12" cy="5" r="2.2" fill="#d62728"/></svg>'
)

st.set_page_config(page_title="noisescope", page_icon=ICON, layout="wide")


def _page(
    view: str,
    title: str,
    icon: str,
    *,
    url_path: str | None = None,
    default: bool = False,
    visibility: Literal["visible", "hidden"] = "visible",
) -> StreamlitPage:
    """The page ``views/<view>.py`` under a Material ``icon``, at ``/<view>`` with hyphens for
    underscores (``/compare-runs``) unless ``url_path`` names another."""
    return st.Page(
        _HERE / "views" / f"{view}.py",
        title=title,
        icon=f":material/{icon}:",
        url_path=url_path or view.replace("_", "-"),
        default=default,
        visibility=visibility,
    )


PAGES = [
    # Streamlit serves the default page at "/" only; the hidden twin below answers "/runs".
    _page("runs", "Runs", "list", url_path="home", default=True),
    _page("runs", "Runs", "list", visibility="hidden"),
    _page("run", "Run", "show_chart"),
    _page("compare_runs", "Compare runs", "compare_arrows"),
    _page("compare_tasks", "Compare tasks", "stacked_line_chart"),
    _page("critical_batch", "Critical batch size", "functions"),
    _page("what_if", "What-if", "tune"),
]

st.navigation(PAGES, position="top").run()
