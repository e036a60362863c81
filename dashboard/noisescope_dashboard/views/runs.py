"""Runs page: every run with its current B_simple, interval, batch in use and B / B_simple.

All values are ``GET /api/v1/runs``'s: the current B_simple here is the same number as on the
Run page, the recommendation endpoint and the API. Filters, search and sort live in the query
string; while any run is running the table re-reads every few seconds (a fragment, so only
the table reruns). A page that opens as the server lists runs (newest first, no filter) draws
the newest ``FIRST_RUNS`` at once and the whole list when it has read it: with 10,000 runs the
whole read takes a second or more (docs/benchmarks.md).
"""

from __future__ import annotations

import time
from typing import Any

import pandas as pd
import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from noisescope import RunSummary, protocol
from noisescope_dashboard import _data, _frames, _state, _text, _ui

#: Row height of Streamlit's dataframe, and the tallest table before it scrolls.
TABLE_ROW_PX = 35
TABLE_MAX_PX = 900
#: Runs drawn before the whole list is read: more than a table shows without scrolling.
FIRST_RUNS = 100
#: Where a session keeps when it last read the whole list (``time.monotonic``): within
#: ``_data.TTL_S`` of it the list comes from the cache at once.
READ_AT = "_runs_read_at"


#: Sort key -> (column of ``_frames.runs_table``, ascending).
SORTS = {
    "started": ("started_at", False),
    "name": ("name", True),
    "b_simple": ("_b_simple", False),
    "ratio": ("_ratio", True),
    "loss": ("_loss", True),
}
SORT_LABELS = {
    "started": "newest first",
    "name": "name",
    "b_simple": "B_simple (largest first)",
    "ratio": "B / B_simple (smallest first)",
    "loss": "loss (lowest first)",
}


def _filtered(
    runs: list[RunSummary],
    projects: list[str],
    tasks: list[str],
    tags: list[str],
    statuses: list[str],
    search: str,
) -> pd.DataFrame:
    table = _frames.runs_table(
        r
        for r in runs
        if (not projects or r.project in projects)
        and (not tasks or r.task in tasks)
        and (not statuses or r.status in statuses)
        and (not tags or set(tags) & set(r.tags))
    )
    if search:
        haystack = (
            table["name"] + " " + table["project"] + " " + table["task"] + " " + table["tags"]
        )
        haystack += " " + table["_config"] + " " + table["uid"]
        table = table[haystack.str.lower().str.contains(search.lower(), regex=False)]
    return table


def _table(shown: pd.DataFrame, **kwargs: Any) -> Any:
    return _ui.table(
        shown,
        _ui.RUN_COLUMNS,
        fit=_ui.RUN_FIT,
        height=min(TABLE_ROW_PX * (len(shown) + 1) + 3, TABLE_MAX_PX),
        **kwargs,
    )


def _newest_first(src: _data.Source, slot: DeltaGenerator) -> None:
    """Draw the newest ``FIRST_RUNS`` runs into ``slot`` while the whole list is read, where
    the page opens in the server's own order and the list is not already read. The query
    string holds the filters, the search and a sort other than newest first (``_state``
    leaves defaults out): a page opened with any of them reads the whole list before it
    draws, since the newest runs need not be the ones it shows."""
    if st.query_params:
        return
    if time.monotonic() - st.session_state.get(READ_AT, float("-inf")) < _data.TTL_S:
        return
    newest = _data.newest_runs(src, FIRST_RUNS)
    if len(newest) < FIRST_RUNS:  # these are all: the whole list follows at once
        return
    shown = _frames.runs_table(newest)
    with slot.container():
        st.caption(f"The newest {len(shown):,} runs · reading the rest…")
        _table(shown)


def main(src: _data.Source) -> None:
    st.title("Runs")
    filters = st.container()
    slot = st.empty()
    _newest_first(src, slot)
    runs = _data.runs(src)
    st.session_state[READ_AT] = time.monotonic()
    with filters:
        projects, tasks, tags, statuses, search, sort, live = _filters(runs)

    @st.fragment(run_every=_data.LIVE_EVERY if live else None)
    def runs_table() -> None:
        current = _data.runs(src) if live else runs
        shown = _filtered(current, projects, tasks, tags, statuses, search or "")
        column, ascending = SORTS[str(sort)]
        shown = shown.sort_values(column, ascending=ascending, na_position="last")
        shown = shown.reset_index(drop=True)
        caption = _text.runs_shown(len(shown), len(current), protocol.MAX_RUNS_LISTED)
        st.caption(caption + (" · live" if live else ""))
        if shown.empty:
            st.info("No run matches these filters. Clear the search or the filters above.")
            return
        event = _table(shown, on_select="rerun", selection_mode="single-row", key="runs_table")
        rows = event.selection.rows if event is not None else []
        if rows:
            row = shown.iloc[rows[0]]
            st.page_link(
                "views/run.py",
                label="Open " + _text.md(f"{row['project']} / {row['task']} / {row['name']}"),
                icon=":material/show_chart:",
                query_params={"run": str(row["uid"])},
            )
        else:
            st.caption("Select a row to open the run.")

    slot.empty()  # the newest runs drawn first give way to the whole list
    runs_table()


def _filters(
    runs: list[RunSummary],
) -> tuple[list[str], list[str], list[str], list[str], str, str | None, bool]:
    """The filter row, the search and sort row, and the live toggle, over the runs read."""
    f1, f2, f3, f4 = st.columns(4)
    projects = f1.multiselect(
        "Project", sorted({r.project for r in runs}), key="project", bind=_state.BOUND
    )
    tasks = f2.multiselect(
        "Task",
        sorted({r.task for r in runs if not projects or r.project in projects}),
        key="task",
        bind=_state.BOUND,
    )
    tags = f3.multiselect(
        "Tag", sorted({t for r in runs for t in r.tags}), key="tag", bind=_state.BOUND
    )
    statuses = f4.multiselect(
        "Status", sorted({r.status for r in runs}), key="status", bind=_state.BOUND
    )
    s1, s2, s3 = st.columns([3, 1, 1])
    search = s1.text_input(
        "Search names, tasks, tags and config",
        key="q",
        bind=_state.BOUND,
        placeholder="e.g. lr=0.1",
    )
    sort = _state.select(
        "Sort by", list(SORTS), key="sort", format_func=SORT_LABELS.__getitem__, container=s2
    )
    live = s3.toggle(
        "Live",
        value=any(r.status == "running" for r in runs),
        key="live",
        help=f"Re-read every {_data.LIVE_EVERY.seconds} s while runs are running",
    )
    return projects, tasks, tags, statuses, search or "", sort, live


_ui.run_page(main)
