"""What-if: how far does this task parallelise? ``GET /api/v1/parallelism`` at a critical
batch size the user picks the source of: a determined sweep fit (with S_min, so steps and
hours are absolute), B_simple at a target's loss, or the median current B_simple of the task's
runs. The page shows the API's summary and verdict sentences, its table of device counts, the
time/compute trade-off and the speed-up against devices.
"""

from __future__ import annotations

import statistics
from typing import Any

import streamlit as st

from noisescope import TaskSummary
from noisescope.estimators import MIN_SPEEDUP
from noisescope.sweep import MIN_BATCH_SIZES, TargetResult
from noisescope_dashboard import _charts, _data, _frames, _state, _text, _ui
from noisescope_dashboard._frames import Estimate, default_reason, default_source
from noisescope_dashboard._text import md


def sweep_targets(src: _data.Source, task: TaskSummary) -> list[TargetResult]:
    """The loss targets of the task's sweep fit, at the Critical batch size page's default
    targets; none unless its runs span enough batch sizes."""
    return _data.sweep_report(src, task.project, task.task).targets if task.swept else []


def sources(task: TaskSummary, targets: list[TargetResult]) -> dict[str, Estimate]:
    """The task's possible critical batch sizes (from its sweep ``targets`` and its runs),
    keyed as in ``?source=``."""
    out: dict[str, Estimate] = {}
    units = _text.units_word(_text.task_units(task))
    for t in targets:
        if t.determined and t.b_crit is not None:
            out[f"bcrit:{t.target:g}"] = Estimate(
                f"B_crit at loss {_text.target(t.target)} (sweep fit): "
                f"{_text.count(t.b_crit)} {units}",
                t.b_crit,
                t.s_min,
                f"B_crit = {_text.count(t.b_crit)} {units} (90% interval "
                f"{_text.interval(t.b_crit_lo, t.b_crit_hi)}) from the task's batch-size sweep "
                f"at loss {_text.target(t.target)}, with S_min = {_text.count(t.s_min)} steps: "
                "steps and hours below are absolute.",
                warnings=tuple(t.warnings),
            )
    if task.b_simple_median is not None:
        out["median"] = Estimate(
            f"median current B_simple of the task's runs: {_text.count(task.b_simple_median)} "
            f"{units}",
            task.b_simple_median,
            None,
            f"B_simple = {_text.count(task.b_simple_median)} {units}, the median current "
            f"B_simple of the task's {_text.plural(task.n_measured, 'measured run')}"
            + _text.task_behind(task)
            + ", as the estimate of B_crit (it may underestimate it); no S_min, so steps are "
            "relative to the minimum.",
            "B_simple",
        )
    for t in targets:
        if t.b_simple is not None:
            out[f"bsimple:{t.target:g}"] = Estimate(
                f"B_simple at loss {_text.target(t.target)}: {_text.count(t.b_simple)} {units}",
                t.b_simple,
                None,
                f"B_simple = {_text.count(t.b_simple)} {units} measured at loss "
                f"{_text.target(t.target)} as the estimate of B_crit (it may underestimate "
                "it); no S_min, so steps are relative to the minimum.",
                "B_simple",
            )
    return out


def task_order(tasks: list[TaskSummary]) -> list[TaskSummary]:
    """Tasks with a batch-size sweep first (the page opens on the first), most batch sizes
    first, then by name."""
    return sorted(tasks, key=lambda t: (not t.swept, -len(t.batch_sizes), t.project, t.task))


def _batch_input(label: str, key: str, default: int, container: Any) -> int:
    """A whole, positive batch size in ``?key=``."""
    value = _state.number(
        label, key=key, value=max(1, default), min_value=1, step=1, container=container
    )
    return int(value)


def main(src: _data.Source) -> None:
    st.title("What-if")
    task = _ui.pick_task(task_order(_data.tasks(src)))
    units = _text.task_units(task)
    word = _text.units_word(units)
    targets = sweep_targets(src, task)
    options = sources(task, targets)
    if not options:
        if task.n_unread:  # not "train longer": the runs may measure, unread
            st.info(
                "This task has neither a determined critical batch size nor a measured "
                f"B_simple yet, but the server has not read {_text.plural(task.n_unread, 'run')} "
                "of it yet (at thousands of live runs it reads them within seconds): reload "
                "the page shortly."
            )
        else:
            st.info(
                "This task has neither a determined critical batch size nor a measurable "
                "B_simple yet. Let a run train longer (B_simple needs enough steps), or run "
                f"the task at {MIN_BATCH_SIZES} or more batch sizes."
            )
        st.stop()
    chosen = _state.select(
        "Critical batch size from",
        list(options),
        key="source",
        default=default_source(options),
        format_func=lambda k: options[k].label,
    )
    source = options[str(chosen)]
    st.caption(md(source.explain))
    why = default_reason(options, str(chosen)) if chosen == default_source(options) else None
    if why:
        st.caption(md(why))
    if source.warnings:
        st.warning(
            "The sweep says to read this B_crit with care: " + md(" · ".join(source.warnings))
        )
    open_targets = [t for t in targets if not t.determined]
    if open_targets:  # an undetermined fit is no source: say so rather than offer its number
        st.caption(
            "Not offered: B_crit at loss "
            + ", ".join(_text.target(t.target) for t in open_targets)
            + ", not determined by the sweep (the Critical batch page says why)."
        )

    runs = [r for r in _data.run_list(src) if (r.project, r.task) == (task.project, task.task)]
    in_use = [r.batch_in_use for r in runs if r.batch_in_use is not None]
    # a batch some run uses (median_low): the mean of the middle two is often none of them
    default_batch = int(statistics.median_low(in_use)) if in_use else int(max(source.b_crit, 1))
    smallest = int(min(task.batch_sizes)) if task.batch_sizes else 32
    c1, c2, c3, c4 = st.columns(4)
    per_device = _batch_input(f"Batch per device ({word})", "per_device", smallest, c1)
    step_time = _state.number(
        "Step time (seconds; 0: unknown)",
        key="step_time",
        value=0.0,
        min_value=0.0,
        step=0.1,
        help="Seconds per optimizer step, taken as the same on any number of devices",
        container=c2,
    )
    min_speedup = _state.number(
        "Minimum speed-up per doubling",
        key="min_speedup",
        value=MIN_SPEEDUP,
        min_value=1.05,
        max_value=1.95,
        step=0.05,
        container=c3,
    )
    batch = _batch_input(f"A batch size to judge ({word})", "b", default_batch, c4)
    plan = _data.parallelism(
        src,
        source.b_crit,
        float(per_device),
        s_min=source.s_min,
        step_time=float(step_time) or None,
        min_speedup=float(min_speedup),
        units=units,
        batch_size=float(batch),
        reference=source.reference,
    )
    st.info(md(plan.summary), icon=":material/speed:")
    if plan.verdict:
        st.markdown(f"**Batch {_text.count(batch)}:** " + md(plan.verdict))
    m1, m2, m3 = st.columns(3)
    # the row the summary names (the last one whose doubling paid), as the table shows it
    last = next((r for r in plan.rows if r.devices == plan.paying_devices), None)
    m1.metric(
        "Devices while doubling pays",
        _text.count(plan.paying_devices),
        help=f"The last device count the doubling to which sped training up by at least "
        f"{plan.min_speedup:g}× (the model's exact limit: "
        f"{_text.count(plan.device_limit)} devices)",
    )
    m2.metric("Batch there", f"{_text.count(last.batch_size if last else None)} {word}")
    m3.metric(
        "Compute beyond E_min there",
        _frames.beyond_minimum(last.waste if last else None),
        help="Of the compute spent there, the share beyond the minimum: 1 − E_min/E "
        "(E/E_min 1.5× spends a third of its compute beyond the minimum)",
    )
    if source.s_min is None:  # said here, above the columns it empties, and in their cells
        st.caption(
            "Steps and time stay empty: they need S_min, which only a sweep fit gives (pick a "
            "B_crit from a sweep fit above)."
        )
    elif plan.step_time is None:
        st.caption("Time stays empty until a step time is entered above.")
    _ui.table(
        _frames.parallelism_table(plan, units),
        fit=["steps", "time"],
        column_config=_ui.described(
            {
                "S / S_min": "Optimizer steps relative to the fewest possible",
                "E / E_min": f"{word.capitalize()} relative to the fewest possible",
                "speed-up": "Over one device",
                "this doubling": "Speed-up from the previous row's device count",
                _frames.BEYOND: "Of the compute spent, the share beyond the minimum: "
                "1 − E_min/E (E/E_min 1.5× is 33% of it)",
                "doubling": f"Whether the doubling to this row sped training up by at least "
                f"{plan.min_speedup:g}× (grey on the charts when not)",
            }
        ),
    )
    rows = _frames.parallelism_rows(plan)
    _ui.chart_with_downloads(
        _charts.tradeoff_chart(rows, units=word),
        rows,
        name="tradeoff",
        caption="S/S_min = 1 + B_crit/B against E/E_min = 1 + B/B_crit (docs/science.md) at "
        "B = devices × batch per device; grey points are past the device limit.",
    )
    _ui.chart_with_downloads(
        _charts.speedup_chart(rows),
        rows,
        name="speedup",
        caption="The S-E model's speed-up over one device beside ideal scaling.",
    )


_ui.run_page(main)
