"""What the Compare runs and Compare tasks pages share: B_simple against loss and progress.

The curves are ``GET /api/v1/series`` (each run bucketed by the server and smoothed over the
same fraction of its own length). One chart per unit: B_simple in tokens and B_simple in
examples are different quantities and never share an axis. Full width, the legend under the
chart with its labels never cut, a click on a legend entry highlights it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import streamlit as st

from noisescope import RunSummary

from . import _charts, _data, _frames, _state, _text
from ._ui import chart_with_downloads

__all__ = ["GROUPS", "PROGRESS_AXES", "bands_section", "compare_section"]

PROGRESS_AXES = {
    "progress": "fraction of the run (step ÷ the run's last step)",
    "step": "optimizer step",
    "examples": "examples or tokens seen",
}


def compare_section(
    src: _data.Source,
    runs: Sequence[RunSummary],
    *,
    color: str,
    key: str,
    progress: bool = True,
    noun: str = "runs",
    colours: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """Controls and charts for ``runs``; ``color`` is ``run_name`` or ``task``, ``colours``
    the page's fixed name-to-colour mapping, if it has one. Returns the points drawn."""
    c1, c2, c3 = st.columns([1.4, 1.2, 1])
    progress_x = "progress"
    if progress:
        progress_x = str(
            _state.select(
                "Progress axis",
                list(PROGRESS_AXES),
                key="px",
                format_func=PROGRESS_AXES.__getitem__,
                container=c1,
            )
        )
    fraction = _smoothing_window(c2)
    with c3:
        log_y = _state.checkbox("log B_simple", key="logy", value=True)
        log_loss = _state.checkbox("log loss", key="logloss")
        log_x = progress and _state.checkbox("log progress", key="logx")
        # a diverged run's loss (far above its minimum) would stretch the loss axis: left off
        # it unless asked for (RunSummary.diverged), and the caption names it
        diverged = {r.uid: r.name for r in runs if r.diverged}
        keep_diverged = bool(diverged) and _state.checkbox(
            "diverged runs on the loss axis", key="divloss"
        )
    by_uid = {r.uid: r for r in runs}
    series = _data.compare(src, tuple(by_uid), float(fraction))
    points = _frames.compare_points(series, by_uid)
    if points.empty:
        st.info("These runs have no samples yet; they appear once training loops post them.")
        return points
    left_off = (
        ""
        if keep_diverged or not diverged
        else (
            ' Left off this chart, their loss diverged (tick "diverged runs on the loss axis" '
            "to draw them): " + ", ".join(sorted(diverged.values())) + "."
        )
    )
    color_title = "run" if color == "run_name" else "task"
    units = sorted(points["units"].unique())
    for unit in units:
        part = points[points["units"] == unit]
        word = _text.units_word(str(unit))
        suffix = f" — {noun} in {word}" if len(units) > 1 else ""
        # (name, what B_simple is drawn against, its x axis, caption)
        views: list[tuple[str, str, _charts.XAxis, str | None]] = [
            (
                "loss",
                "loss",
                _charts.XAxis(
                    "loss", "training loss (falls to the right)", log=log_loss, reverse=True
                ),
                "The paper's view: the noise scale grows as the loss falls. Click a legend "
                "entry to highlight it." + left_off,
            )
        ]
        if progress:
            x_title = f"{word} seen" if progress_x == "examples" else PROGRESS_AXES[progress_x]
            x_axis = _charts.XAxis(progress_x, x_title, log=log_x)
            views.append(("progress", "training progress", x_axis, None))
        for name, against, x_axis, caption in views:
            title = f"B_simple against {against}{suffix}"
            drawn = part[~part["run"].isin(list(diverged))] if name == "loss" and left_off else part
            if name == "loss" and _frames.loss_points(drawn, log_loss=log_loss).empty:
                st.subheader(title, anchor=False)  # an empty frame would say nothing
                st.info(nothing_against_loss(drawn, log_loss=log_loss, who="These runs"))
                continue
            chart_with_downloads(
                _charts.compare_chart(
                    drawn,
                    x=x_axis,
                    color=color,
                    color_title=color_title,
                    log_y=log_y,
                    y_title=f"B_simple ({word})",
                    title=title,
                    colours=colours,
                ),
                drawn,
                name=f"{key}_b_simple_vs_{name}_{word}",
                caption=caption,
            )
    return points


#: What Compare tasks draws a line per (``_frames.group_label``).
GROUPS = {"batch": "batch size", "lr": "learning rate (config `lr`)"}


def nothing_against_loss(points: pd.DataFrame, *, log_loss: bool, who: str) -> str:
    """Why a B_simple-against-loss chart of ``who`` ("These runs") draws nothing
    (``_frames.loss_points`` is empty): runs with a B_simple but no training loss must not read
    as runs that measure nothing."""
    if points["b_simple"].isna().all():
        return f"{who} have no B_simple yet; they appear once runs post samples."
    if log_loss and not _frames.loss_points(points, log_loss=False).empty:
        return 'No training loss above 0 to draw on a log axis: untick "log loss".'
    return (
        f"{who} have a B_simple but no training loss, and this view draws B_simple against "
        "the loss: log it with the samples (`run.log(loss=...)`, or `loss=` to the probe's "
        "`step`). Against progress, B_simple needs no loss."
    )


def bands_section(src: _data.Source, runs: Sequence[RunSummary], *, key: str) -> pd.DataFrame:
    """Compare tasks' B_simple against loss: one chart per task (tasks' losses are not on one
    scale), one median line with a band per batch size or learning rate, each run on demand.
    Diverged runs are left out (their loss leaves the axis). Returns the bands drawn."""
    c1, c2, c3 = st.columns([1.4, 1.2, 1])
    by = _state.radio("A line per", GROUPS, key="by", container=c1)
    fraction = _smoothing_window(c2)
    with c3:
        log_y = _state.checkbox("log B_simple", key="logy", value=True)
        log_loss = _state.checkbox("log loss", key="logloss")
        each = _state.checkbox("each run too", key="each")
        # off by default: a sweep's bands (one per batch size) overlap into one smear
        ranges = _state.checkbox("lowest–highest band", key="bands")
    kept = {r.uid: r for r in runs if not r.diverged}
    diverged = sorted(r.name for r in runs if r.diverged)
    series = _data.compare(src, tuple(kept), float(fraction))
    points = _frames.compare_points(series, kept)
    bands = _frames.band_points(points, kept, by, log_loss=log_loss)
    if bands.empty:
        st.info(nothing_against_loss(points, log_loss=log_loss, who="These tasks' runs"))
        return bands
    group_title = "batch size" if by == "batch" else "learning rate"
    caption = (
        f"Per {group_title}, the median B_simple of its runs over bins of the loss, smoothed "
        'over the window above. Tick "lowest–highest band" to shade the range of its runs, '
        '"each run too" to draw every run as a thin line. Click a legend entry to highlight it.'
    )
    if diverged:
        caption += " Left out, their loss diverged: " + _text.md(", ".join(diverged)) + "."
    for i, task in enumerate(sorted(bands["task"].unique())):
        part = bands[bands["task"] == task]
        unit = str(part["units"].iloc[0])
        word = _text.units_word(unit)
        run_part = None
        if each:
            run_part = points[points["task"] == task]
            run_part = run_part.assign(
                group=[_frames.group_label(kept[u], by) for u in run_part["run"]]
            )
        chart_with_downloads(
            _charts.band_chart(
                part,
                run_part,
                x=_charts.XAxis(
                    "loss", "training loss (falls to the right)", log=log_loss, reverse=True
                ),
                group_title=group_title,
                title=f"B_simple against loss: {task}",
                log_y=log_y,
                y_title=f"B_simple ({word})",
                ranges=ranges,
            ),
            part,
            name=f"{key}_b_simple_vs_loss_{i + 1}",
            user_text=True,
            caption=caption if i == 0 else None,
        )
    return bands


def _smoothing_window(container: Any) -> float:
    """The trailing-window control both comparison views share (``?win=``)."""
    return _state.number(
        "Smoothing window (fraction of each run)",
        key="win",
        value=0.1,
        min_value=0.0,
        max_value=1.0,
        step=0.05,
        help="Each point sums the trailing window of this share of its run's steps "
        "(ratio last); 0: each bucket alone",
        container=container,
    )
