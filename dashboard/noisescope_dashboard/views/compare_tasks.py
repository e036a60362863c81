"""Compare tasks, as the paper draws it (McCandlish et al. 2018, Fig. 5 and Fig. 7):

(a) B_simple against B_crit across tasks, one point per task and loss target whose fit is
determined (``GET /tasks/{project}/{task}/critical-batch``), both intervals, y = x for reference,
one chart per unit, or every task on one chart as the paper's figure puts them (``?together``);
(b) B_simple against loss, one chart per task, a median line with a band per batch size (or
learning rate), each run on demand (``GET /series``);
(c) the per-task summary (``GET /tasks``).
"""

from __future__ import annotations

from collections.abc import Mapping

import streamlit as st

from noisescope import TaskSummary
from noisescope.sweep import MIN_BATCH_SIZES, CriticalBatchReport
from noisescope_dashboard import _charts, _data, _frames, _state, _text, _ui
from noisescope_dashboard._compare import bands_section
from noisescope_dashboard._text import md

VERSUS = "B_simple against B_crit across tasks"
CAPTION = (
    "One point per task and loss target whose B_crit fit is determined: B_crit from the task's "
    "batch-size sweep, B_simple measured at the same loss in the runs the fit used; bars are 90% "
    "intervals (an interval reaching 0 is drawn to the axis). On the dashed line B_simple "
    "equals B_crit; the paper finds B_simple within a small factor of B_crit, often below it. "
    "Tasks counting tokens and tasks counting examples get one chart each."
)
TOGETHER = (
    "One chart for every unit, as the paper's figure puts them: each task in its own units "
    "(examples or tokens), so the positions compare tasks, not the numbers across units."
)


def _versus_b_crit(src: _data.Source, tasks: list[TaskSummary], colours: Mapping[str, str]) -> None:
    swept = [t for t in tasks if t.swept]
    reports: list[CriticalBatchReport] = [_data.sweep_report(src, t.project, t.task) for t in swept]
    points, left_out = _frames.tasks_b_simple_vs_b_crit(reports)
    for t in tasks:
        if not t.swept:
            left_out.loc[len(left_out)] = [
                _text.task_key(t.project, t.task),
                "",
                f"runs at {_text.plural(len(t.batch_sizes), 'batch size')}; a critical batch "
                f"size needs {MIN_BATCH_SIZES} or more",
            ]
    if points.empty:
        st.subheader(VERSUS, anchor=False)
        st.info(
            "No task has a determined critical batch size yet: run a task at "
            f"{MIN_BATCH_SIZES} or more batch sizes (each with its learning rate tuned), until "
            "its loss falls past the targets. "
            "Why each task or target is left out is listed below."
        )
    units = sorted(points["units"].unique())
    together = len(units) > 1 and _state.checkbox(
        "Every unit on one chart (as the paper's figure)", key="together"
    )
    if together:
        units = ["task units"]
    for i, unit in enumerate(units):  # each at the page's full width, one under the other
        part = points if together else points[points["units"] == unit]
        word = "task units" if together else _text.units_word(str(unit))
        _ui.chart_with_downloads(
            _charts.b_simple_vs_b_crit_chart(part, units=word, colours=colours),
            part,
            name=f"b_simple_vs_b_crit_{word.replace(' ', '_')}",
            caption=(TOGETHER if together else CAPTION) if i == 0 else None,
        )
    if not left_out.empty:
        these = "these charts" if len(units) > 1 else "this chart"
        with st.expander(f"Left out of {these} ({len(left_out)})", expanded=points.empty):
            _ui.table(left_out)


def main(src: _data.Source) -> None:
    st.title("Compare tasks")
    tasks = _data.tasks(src)
    keys = {_text.task_key(t.project, t.task): t for t in tasks}
    chosen_keys = st.multiselect(
        "Tasks (project/task)", list(keys), default=list(keys), key="tasks", bind=_state.BOUND
    )
    if not chosen_keys:
        st.info("Pick one or more tasks above.")
        st.stop()
    chosen = [keys[k] for k in chosen_keys]
    # one colour per task in every chart of the page, whichever tasks each chart draws
    colours = _charts.palette_colours(chosen_keys)
    _versus_b_crit(src, chosen, colours)
    # a task none of whose runs has a current B_simple gets no curve: its per-bucket values
    # are not measurements (the summary below says "0 of N measured")
    wanted = {(t.project, t.task) for t in chosen if t.n_measured > 0}
    runs = [r for r in _data.run_list(src) if (r.project, r.task) in wanted]
    bands_section(src, runs, key="tasks")
    unmeasured = [t for t in chosen if t.n_measured == 0]
    if unmeasured:
        st.caption(
            "Not drawn, no run of theirs has a current B_simple: "
            + "; ".join(
                md(f"{_text.task_key(t.project, t.task)} ({_text.task_unmeasured(t)})")
                for t in unmeasured
            )
            + "."
        )
    st.subheader("Summary per task", anchor=False)
    summary = _frames.task_table(chosen)
    _ui.table(
        summary,
        # names and the batch sizes whole ("4, 8, …, 256" was cut at its last size)
        fit=["project", "task", "batch sizes"],
        column_config={
            "runs": st.column_config.TextColumn("runs", width="small"),
            "running": st.column_config.TextColumn("running", width="small"),
            "units": st.column_config.TextColumn("units", width="small"),
            "B_simple median": st.column_config.TextColumn(
                "B_simple median", help="Median of the task's runs' current B_simple"
            ),
            "B_simple range": st.column_config.TextColumn(
                "B_simple min – max", help="Smallest and largest current B_simple of its runs"
            ),
            "measured runs": st.column_config.TextColumn(
                "measured",
                help="Runs whose current B_simple is measurable; in brackets, those whose "
                "B_simple is as the server stored it seconds ago, and those it has not read "
                "yet, unmeasured until it does (at thousands of live runs one list reads the "
                "windows of only some of those that logged since)",
            ),
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


_ui.run_page(main)
