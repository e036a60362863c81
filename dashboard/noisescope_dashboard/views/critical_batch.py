"""Critical batch size of a task from its batch-size sweep, per loss target, as the server's
``GET /tasks/{project}/{task}/critical-batch`` reports it (``noisescope.sweep``): which loss was
used, B_crit with its 90% interval (or "not determined" and why), S_min, E_min, B_simple at the
same loss, the frontier of fastest learning rates, the S-E plane with the fitted hyperbola,
and B_crit against loss beside B_simple. Task, loss and targets live in the query string.
"""

from __future__ import annotations

import streamlit as st

from noisescope.sweep import MIN_BATCH_SIZES, TARGETS_CONFIG_KEY, CriticalBatchReport
from noisescope_dashboard import _charts, _data, _frames, _state, _text, _ui
from noisescope_dashboard._text import md

LOSSES = {
    "auto": "auto (evaluations when every run has them)",
    "eval": "evaluation loss",
    "train": "training loss (smoothed)",
}


def parse_targets(text: str) -> tuple[list[float], list[str]]:
    """Loss targets from "1.0, 0.6 0.3": the numbers, and the pieces that are not."""
    numbers: list[float] = []
    bad: list[str] = []
    for part in text.replace(";", ",").replace(" ", ",").split(","):
        if part.strip():
            try:
                numbers.append(float(part))
            except ValueError:
                bad.append(part.strip())
    return numbers, bad


def _targets(src: _data.Source, project: str, task: str, loss: str) -> CriticalBatchReport:
    """The report for the targets in ``?targets=`` (the sweep's defaults when absent: the
    targets its runs name, ``_data.default_targets``, else the server's); the input shows them
    and writes an edit back to the URL."""
    raw = st.query_params.get("targets")
    asked, bad = parse_targets(raw or "")
    declared = _data.default_targets(src, project, task)
    chosen = tuple(asked) or declared
    report = _data.critical_batch(src, project, task, chosen, loss)  # type: ignore[arg-type]
    shown = raw if raw else ", ".join(f"{t.target:g}" for t in report.targets)
    text = st.text_input(
        "Loss targets (comma separated; empty: the defaults)",
        value=shown,
        key="_qp_targets",
        help="Each target is a loss every batch size should reach. The defaults are the "
        f"targets the sweep's runs name in their config (`{TARGETS_CONFIG_KEY}`, as "
        "`python -m experiments` writes them), else they lie between where the runs start "
        "and the best loss every batch size reaches.",
    )
    if text != shown:
        if text.strip():
            st.query_params["targets"] = text
        elif "targets" in st.query_params:
            del st.query_params["targets"]
        asked, bad = parse_targets(text)
        chosen = tuple(asked) or declared
        report = _data.critical_batch(src, project, task, chosen, loss)  # type: ignore[arg-type]
    if not asked and declared:
        st.caption(
            "The sweep's own targets, named in its runs' config "
            f"(`{TARGETS_CONFIG_KEY}`): the ones `python -m experiments` analysed it at, so "
            "these are the critical batch sizes it printed."
        )
    if bad:
        st.error("Not numbers, left out: " + md(", ".join(bad)) + ". Write targets like 0.5, 0.3")
    return report


def _results(report: CriticalBatchReport) -> None:
    units = _text.units_word(report.units)
    st.subheader("Per loss target", anchor=False)
    _ui.table(_frames.target_table(report), fit=["warnings"])
    # the table first, then the report's warnings and the targets': the API's (diverged runs,
    # why B_crit is not determined, a frontier lr at the grid's edge, single seeds) are
    # warnings; only a missing B_simple at a determined target is a note
    warnings = [md(w) for w in report.warnings]
    notes: list[str] = []
    for t in report.targets:
        said = _frames.target_warnings(t)
        if not said:
            continue
        line = (
            f"Loss {md(_text.target(t.target))}"
            + ("" if t.determined else " (not determined)")
            + ": "
            + md(" · ".join(said))
        )
        (warnings if t.warnings or not t.determined else notes).append(line)
    _ui.show_warnings(warnings)
    for line in notes:
        st.caption(line)
    frontier = _frames.frontier_table(report)
    if not frontier.empty:
        st.subheader("Frontier: the fastest learning rate per batch size", anchor=False)
        st.caption(
            "Per target and batch size, the learning rate whose runs reached the target in the "
            "fewest steps (the median over its seeds): the points the fit goes through."
        )
        _ui.table(frontier)
    st.caption(
        f"B_crit, S_min and E_min come from fitting S = S_min (1 + B_crit/B) through the "
        f"frontier (per batch size, the learning rate that reached the target in the fewest "
        f"steps); a target whose fit is not determined shows no number. {report.level:.0%} "
        f"intervals. B_simple at this loss pools the frontier runs' samples around the step "
        "where each reached it."
    )
    points = _frames.sweep_points(report)
    if not points.empty:
        _ui.chart_with_downloads(
            _charts.sweep_chart(points, _frames.sweep_curves(report), units=units),
            points,
            name="steps_vs_examples",
            caption="Each run's steps and "
            + units
            + " to reach each target. Filled: the fastest learning rate at each batch size "
            "(the runs the fit used); hollow: the other runs. Dashed: the fitted "
            "S = S_min (1 + B_crit/B), E = E_min (1 + B/B_crit), drawn only where B_crit is "
            "determined.",
        )
    versus = _frames.bcrit_vs_loss(report)
    if not versus.empty:
        _ui.chart_with_downloads(
            _charts.bcrit_vs_loss_chart(versus, units=units),
            versus,
            name="b_crit_vs_loss",
            caption="Bars: 90% intervals (an interval reaching 0 is drawn to the axis). "
            "B_simple is expected to track B_crit within a small factor and may underestimate "
            "it (Merrill et al. 2025).",
        )
    if report.excluded:
        st.subheader("Runs left out", anchor=False)
        _ui.table([{"run": e.name, "why": e.reason} for e in report.excluded])
        if any(e.kind == "diverged" for e in report.excluded):
            st.caption(
                "Runs whose loss diverged (it ended far above its minimum, or was not finite) "
                "are left out of the frontier and of the default targets: their learning rate "
                "is not a tuned one."
            )


def main(src: _data.Source) -> None:
    st.title("Critical batch size")
    tasks = sorted(_data.tasks(src), key=lambda t: (-len(t.batch_sizes), t.project, t.task))
    left, right = st.columns([2, 1])
    summary = _ui.pick_task(tasks, container=left)
    loss = _state.select(
        "Loss", list(LOSSES), key="loss", format_func=LOSSES.__getitem__, container=right
    )
    units = _text.units_word(_text.task_units(summary))
    st.caption(
        md(
            f"{_text.plural(summary.n_runs, 'run')} at "
            f"{_text.plural(len(summary.batch_sizes), 'batch size')}: "
            + ", ".join(_text.count(b) for b in summary.batch_sizes)
            + f" {units}"
        )
    )
    if not summary.swept:
        st.warning(
            f"A fit needs runs of this task at {MIN_BATCH_SIZES} or more batch sizes; it has "
            f"{len(summary.batch_sizes)}. Run the same task at several batch sizes (e.g. 4 "
            "sizes spanning 16×, each with its learning rate tuned), then come back."
        )
        st.stop()
    report = _targets(src, summary.project, summary.task, str(loss))
    st.markdown(f"**Loss used:** {md(report.loss_method)}.")
    if not report.targets:
        _ui.show_warnings([md(w) for w in report.warnings])
        st.info("No loss target to fit: see the messages above, or enter targets.")
        st.stop()
    _results(report)
    st.caption(
        "Model (docs/science.md, McCandlish et al. 2018): S = S_min (1 + B_crit/B), "
        "E = E_min (1 + B/B_crit). At B = B_crit a run takes 2× the minimum steps and 2× the "
        "minimum examples."
    )


_ui.run_page(main)
