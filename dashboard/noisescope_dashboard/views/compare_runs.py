"""Compare runs: several runs side by side, B_simple against loss and against progress, and
across model sizes B_simple with the branch-measured local critical batch sizes against loss.

Curves from ``GET /api/v1/series``, branch points from ``GET /api/v1/runs/{id}/branches``; the
table under them is ``GET /api/v1/runs``'s current B_simple of the same runs (the Runs table's
numbers).
"""

from __future__ import annotations

import streamlit as st

from noisescope import RunSummary
from noisescope.estimators import CURRENT_MIN_SAMPLES
from noisescope_dashboard import _data, _frames, _sizes, _state, _text, _ui
from noisescope_dashboard._compare import compare_section

#: Runs compared when the URL names none.
DEFAULT_RUNS = 5


#: The Runs table's columns this page shows, in that order.
COLUMNS = ("name", "task", "batch", "units", "b_simple", "interval", "ratio", "why")


def default_runs(offered: list[RunSummary]) -> list[str]:
    """The runs compared when the URL names none (``offered``: newest first): the newest
    ``DEFAULT_RUNS`` of one task, the newest task with two runs or more to compare (else the
    newest run's). Never several tasks: their losses are not on one scale, and one loss axis
    for them squashes all but the largest to an edge."""
    by_task: dict[tuple[str, str], list[str]] = {}
    for r in offered:
        by_task.setdefault((r.project, r.task), []).append(r.uid)
    chosen = next((uids for uids in by_task.values() if len(uids) > 1), None)
    if chosen is None:
        chosen = next(iter(by_task.values()), [])
    return chosen[:DEFAULT_RUNS]


def _sizes_section(src: _data.Source, chosen: list[RunSummary]) -> None:
    """The chosen runs by model size (docs/dashboard.md): shown when a run names its size in
    its config or has branch runs."""
    branches = {r.uid: _data.branches(src, r.uid) for r in chosen if r.parent_uid is None}
    branched = {uid: b for uid, b in branches.items() if b.points}
    sized = [r for r in chosen if any(k in r.config for k in _sizes.SIZE_KEYS)]
    if not branched and not sized:
        st.caption(
            "Runs that name their model size in their config (`n_params` or `model_size`) "
            "or have branch runs (docs/branching.md) are also drawn by model size, with the "
            "local critical batch size, against loss."
        )
        return
    fraction = float(st.session_state.get("win", 0.1))
    # each run's own series (the comparison series carry no interval), smoothed over the
    # window the charts above used for it (the server's, read from their cached answer)
    compared = _data.compare(src, tuple(r.uid for r in chosen), fraction)
    windows = {s.run_uid: s.window_steps for s in compared}
    series = [_data.series(src, r.uid, x="step", window=windows.get(r.uid, 0.0)) for r in chosen]
    frame = _sizes.marks(chosen, series, branched)
    x = _state.radio(
        "Model sizes against", {"loss": "loss", "examples": "examples or tokens seen"}, key="sx"
    )
    log_x = bool(st.session_state.get("logloss" if x == "loss" else "logx", False))
    units = sorted(set(frame["units"]))
    for unit in units:
        part = frame[frame["units"] == unit]
        word = _text.units_word(str(unit))
        suffix = f" — runs in {word}" if len(units) > 1 else ""
        title = (_sizes.TITLE if x == "loss" else _sizes.TITLE_SEEN.format(word)) + suffix
        where = (
            "at the training loss of each bucket"
            if x == "loss"
            else f"at the {word} seen by the end of each bucket"
        )
        at = (
            "the parent's last evaluation loss at that step"
            if x == "loss"
            else f"the {word} the parent had seen by that step (a run logging no {word} "
            "has no points on this axis)"
        )
        _ui.chart_with_downloads(
            _sizes.chart(part, units=str(unit), x=x, title=title, log_x=log_x),
            part,
            name=f"by_model_size_{word}",
            caption="Colour: the model size, from the run's config `n_params` (parameters), "
            f"else `model_size`, else the run's name. Lines: B_simple {where}, smoothed over "
            "the same fraction of the run as above, with its 90% band (GET /runs/{id}/series). "
            f"Points: the local critical batch size at each branch step, at {at}, with its 90% "
            "interval (an end above the largest batch tried runs to the top; "
            "a triangle: every branch stayed within ε, a lower bound).",
        )


def main(src: _data.Source) -> None:
    st.title("Compare runs")
    runs = _data.runs(src)
    hidden = {r.uid: why for r in runs if (why := _frames.left_out_why(r)) is not None}
    show_all = bool(hidden) and _state.checkbox(
        f"Also offer diverged runs and runs under {CURRENT_MIN_SAMPLES} samples ({len(hidden)})",
        key="all",
    )
    named = set(st.query_params.get_all("runs"))  # a link's runs stay offered
    offered = [r for r in runs if show_all or r.uid not in hidden or r.uid in named]
    labels = {r.uid: _text.run_label(r) for r in offered}
    chosen_uids = _state.multiselect(
        "Runs",
        list(labels),
        key="runs",
        default=default_runs([r for r in offered if r.uid not in hidden]),
        format_func=lambda u: labels.get(u, u),
    )
    if hidden and not show_all:
        counts: dict[str, int] = {}
        for why in hidden.values():
            key = "diverged" if why == "diverged" else "short"
            counts[key] = counts.get(key, 0) + 1
        parts = []
        if counts.get("diverged"):
            parts.append(_text.plural(counts["diverged"], "diverged run"))
        if counts.get("short"):
            parts.append(
                f"{_text.plural(counts['short'], 'run')} under {CURRENT_MIN_SAMPLES} samples"
            )
        st.caption(
            "Not offered: "
            + " and ".join(parts)
            + " (their curves are a few points or a blow-up); tick the box above to pick them."
        )
    if not chosen_uids:
        st.info("Pick two or more runs above to compare their noise scales.")
        st.stop()
    color = _state.radio("Colour by", {"run_name": "run", "task": "task"}, key="color")
    chosen = [r for r in runs if r.uid in set(chosen_uids)]
    tasks = sorted({_text.task_key(r.project, r.task) for r in chosen})
    if len(tasks) > 1:
        st.caption(
            f"These runs belong to {len(tasks)} tasks ({_text.md(', '.join(tasks))}), whose "
            "losses are not on one scale: against loss, compare the runs of one task."
        )
    compare_section(src, chosen, color=color, key="runs")
    _sizes_section(src, chosen)
    st.subheader("These runs now", anchor=False)
    table = _frames.runs_table(chosen)
    _ui.table(
        table,
        {c: _ui.RUN_COLUMNS[c] for c in COLUMNS},
        fit=[c for c in _ui.RUN_FIT if c in COLUMNS],
    )


_ui.run_page(main)
