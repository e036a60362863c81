"""Compare runs: several runs side by side, B_simple against loss and against progress.

Curves from ``GET /api/v1/series``; the table under them is ``GET /api/v1/runs``'s current
B_simple of the same runs (the Runs table's numbers).
"""

from __future__ import annotations

import streamlit as st

from noisescope_dashboard import _data, _frames, _state, _text, _ui
from noisescope_dashboard._compare import compare_section

#: Runs compared when the URL names none.
DEFAULT_RUNS = 5


def main(src: _data.Source) -> None:
    st.title("Compare runs")
    runs = _data.runs(src)
    labels = {r.uid: _text.run_label(r) for r in runs}
    chosen_uids = _state.multiselect(
        "Runs",
        list(labels),
        key="runs",
        default=list(labels)[:DEFAULT_RUNS],
        format_func=lambda u: labels.get(u, u),
    )
    if not chosen_uids:
        st.info("Pick two or more runs above to compare their noise scales.")
        st.stop()
    color = _state.select(
        "Colour by",
        ["run_name", "task"],
        key="color",
        format_func={"run_name": "run", "task": "task"}.__getitem__,
        widget="radio",
        horizontal=True,
    )
    chosen = [r for r in runs if r.uid in set(chosen_uids)]
    compare_section(src, chosen, color=str(color), key="runs")
    st.subheader("These runs now", anchor=False)
    table = _frames.runs_table(chosen)
    st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        column_order=["name", "task", "batch", "units", "b_simple", "interval", "ratio", "why"],
        column_config={
            "name": st.column_config.TextColumn("Run"),
            "task": st.column_config.TextColumn("Task"),
            "batch": st.column_config.TextColumn("Batch in use"),
            "units": st.column_config.TextColumn("Units"),
            "b_simple": st.column_config.TextColumn("B_simple now", help=_text.CURRENT_RULE),
            "interval": st.column_config.TextColumn("90% interval"),
            "ratio": st.column_config.TextColumn("B / B_simple"),
            "why": st.column_config.TextColumn("No B_simple because"),
        },
    )


_ui.run_page(main)
