"""The API's answers laid out as the small frames the charts and tables take.

Arrangement only: columns renamed, numbers formatted as text for tables, marks placed on the
chosen x axis, the progress axis (a point's step over its run's last step), interval ends
clipped to what a log axis can draw. No estimate is made here: every value is the API's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from noisescope._results import EventRow, ParallelismPlan, RunSeries, RunSummary, TaskSummary
from noisescope.sweep import CriticalBatchReport, TargetResult

from . import _text

__all__ = [
    "B_CRIT",
    "B_SIMPLE_AT_LOSS",
    "bcrit_vs_loss",
    "compare_points",
    "eval_points",
    "event_marks",
    "frontier_text",
    "parallelism_rows",
    "parallelism_table",
    "runs_table",
    "series_points",
    "sweep_curves",
    "sweep_points",
    "target_table",
    "target_warnings",
    "task_table",
    "tasks_b_simple_vs_b_crit",
    "time_origin",
]

B_CRIT = "B_crit (sweep fit)"
B_SIMPLE_AT_LOSS = "B_simple at the same loss"

_SERIES_COLUMNS = [
    "x",
    "step",
    "examples",
    "n",
    "b_simple",
    "b_simple_lo",
    "b_simple_hi",
    "g_sq",
    "trace_sigma",
    "loss",
    "lr",
    "batch_size",
]


# --- one run ---------------------------------------------------------------------------------


def time_origin(series: RunSeries) -> float | None:
    """Wall time of a run's first sample on the time axis (None on the other axes)."""
    return series.points[0].x_lo if series.x == "time" and series.points else None


def series_points(series: RunSeries) -> pd.DataFrame:
    """A run's points: ``x`` (the bucket's middle on the series' axis; on the time axis,
    seconds since the run's first sample), ``step`` (the bucket's last step) and the API's
    values. Missing values are NaN, so a chart leaves a gap instead of inventing a point."""
    if not series.points:
        return pd.DataFrame({c: pd.Series(dtype="float") for c in _SERIES_COLUMNS})
    t0 = time_origin(series) or 0.0
    rows = [
        (
            p.x - t0,
            p.step_hi,
            p.examples_hi,
            p.n,
            p.b_simple,
            p.b_simple_lo,
            p.b_simple_hi,
            p.g_sq,
            p.trace_sigma,
            p.loss,
            p.lr,
            p.batch_size,
        )
        for p in series.points
    ]
    frame = pd.DataFrame(rows, columns=_SERIES_COLUMNS)
    return frame.astype(dict.fromkeys(_SERIES_COLUMNS, "float"))


def _place(steps: Sequence[float], points: pd.DataFrame, column: str) -> list[float]:
    """Where steps fall on the x axis, read off the series' own (step, ``column``) pairs."""
    known = points.dropna(subset=["step", column]).sort_values("step")
    if known.empty:
        return [math.nan] * len(steps)
    return [float(v) for v in np.interp(steps, known["step"], known[column])]


def _x_of(
    events: Sequence[EventRow], points: pd.DataFrame, x: str, t0: float | None
) -> list[float]:
    steps = [float(e.step) for e in events]
    if x == "step":
        return steps
    if x == "time":
        return [
            (float(e.time) - t0) if e.time is not None and t0 is not None else math.nan
            for e in events
        ]
    return _place(steps, points, "x")


def _event_label(event: EventRow) -> str:
    payload = event.payload
    if event.kind == "batch_size" and "batch_size" in payload:
        old = payload.get("old_batch_size")
        new = _number_text(payload["batch_size"])
        return f"batch size {_number_text(old)} → {new}" if old is not None else f"batch size {new}"
    detail = ", ".join(f"{k}={v}" for k, v in list(payload.items())[:4])
    return f"{event.kind}: {detail}" if detail else event.kind


def _number_text(value: Any) -> str:
    try:
        return _text.count(float(value))
    except (TypeError, ValueError):
        return str(value)


#: Event kinds that are not marks: evaluations are points on the loss chart, notices text.
NOT_MARKS = ("eval", "notice")


def event_marks(
    events: Sequence[EventRow], points: pd.DataFrame, x: str, t0: float | None = None
) -> pd.DataFrame:
    """Batch-size changes and free-form events as marks: step, kind, label and ``x``."""
    marks = [e for e in events if e.kind not in NOT_MARKS]
    return pd.DataFrame(
        {
            "step": [e.step for e in marks],
            "kind": [e.kind for e in marks],
            "label": [_event_label(e) for e in marks],
            "x": _x_of(marks, points, x, t0),
        },
        columns=["step", "kind", "label", "x"],
    )


def eval_points(
    events: Sequence[EventRow], points: pd.DataFrame, x: str, t0: float | None = None
) -> pd.DataFrame:
    """Evaluation losses (``eval`` events with a finite ``loss``) at their place on ``x``."""
    evals = [
        e
        for e in events
        if e.kind == "eval"
        and isinstance(e.payload.get("loss"), (int, float))
        and math.isfinite(float(e.payload["loss"]))
    ]
    placed = _x_of(evals, points, x, t0)
    if x == "examples":  # an evaluation that says where it was has the last word
        placed = [
            float(e.payload["examples"])
            if isinstance(e.payload.get("examples"), (int, float))
            else v
            for e, v in zip(evals, placed, strict=True)
        ]
    return pd.DataFrame(
        {
            "step": [e.step for e in evals],
            "loss": [float(e.payload["loss"]) for e in evals],
            "x": placed,
        },
        columns=["step", "loss", "x"],
    )


# --- runs ------------------------------------------------------------------------------------


def runs_table(runs: Iterable[RunSummary]) -> pd.DataFrame:
    """The Runs table: the API's fields as text people read ("1,860", "0.3×"), with the raw
    numbers beside them (``_``-prefixed, hidden) for sorting. A run whose B_simple is not yet
    measurable has no number and no ratio, and says why."""
    rows = []
    for r in runs:
        measured = r.b_simple is not None
        rows.append(
            {
                "uid": r.uid,
                "name": r.name,
                "project": r.project,
                "task": r.task,
                "status": _text.status(r),
                "tags": ", ".join(r.tags),
                "batch": _text.count(r.batch_in_use),
                "units": r.units,
                "b_simple": _text.count(r.b_simple) if measured else "",
                "interval": _text.interval(r.b_simple_lo, r.b_simple_hi) if measured else "",
                "ratio": _text.ratio(r.batch_to_b_simple)
                if measured and r.batch_to_b_simple is not None
                else "",
                "why": "" if measured else (r.b_simple_reason or "not yet measurable"),
                "loss": _text.loss(r.last_loss) if r.last_loss is not None else "",
                "step": _text.count(r.last_step) if r.last_step is not None else "",
                "started_at": r.started_at,
                "_b_simple": r.b_simple,
                "_ratio": r.batch_to_b_simple if measured else None,
                "_loss": r.last_loss,
                "_config": " ".join(f"{k}={v}" for k, v in r.config.items()),
            }
        )
    columns = [
        "uid",
        "name",
        "project",
        "task",
        "status",
        "tags",
        "batch",
        "units",
        "b_simple",
        "interval",
        "ratio",
        "why",
        "loss",
        "step",
        "started_at",
        "_b_simple",
        "_ratio",
        "_loss",
        "_config",
    ]
    frame = pd.DataFrame(rows, columns=columns)
    for c in ("_b_simple", "_ratio", "_loss"):
        frame[c] = pd.to_numeric(frame[c], errors="coerce").astype(float)
    return frame


def compare_points(series: Sequence[RunSeries], runs: dict[str, RunSummary]) -> pd.DataFrame:
    """Several runs' points: run, run_name, task, units, step, examples, progress (step over
    the run's last step), loss, b_simple."""
    frames = []
    for s in series:
        run = runs.get(s.run_uid)
        if run is None or not s.points:
            continue
        last = float(run.last_step or max(p.step_hi for p in s.points) or 1)
        frames.append(
            pd.DataFrame(
                {
                    "run": run.uid,
                    "run_name": run.name,
                    "task": _text.task_key(run.project, run.task),
                    "units": run.units,
                    "step": [float(p.step_hi) for p in s.points],
                    "examples": [p.examples_hi for p in s.points],
                    "progress": [p.step_hi / last for p in s.points],
                    "loss": [p.loss for p in s.points],
                    "b_simple": [p.b_simple for p in s.points],
                }
            )
        )
    columns = ["run", "run_name", "task", "units", "step", "examples", "progress"]
    columns += ["loss", "b_simple"]
    if not frames:
        return pd.DataFrame(columns=columns)
    out = pd.concat(frames, ignore_index=True)
    for c in ("examples", "loss", "b_simple"):
        out[c] = pd.to_numeric(out[c], errors="coerce").astype(float)
    return out


def task_table(tasks: Iterable[TaskSummary]) -> pd.DataFrame:
    """The per-task summary of ``GET /tasks``, as text."""
    rows = [
        {
            "project": t.project,
            "task": t.task,
            "runs": _text.count(t.n_runs),
            "running": _text.count(t.n_running),
            "batch sizes": ", ".join(_text.count(b) for b in t.batch_sizes),
            "units": ", ".join(t.units),
            "measured runs": f"{t.n_measured} of {t.n_runs}",
            "B_simple median": _text.count(t.b_simple_median),
            "B_simple range": _text.interval(t.b_simple_min, t.b_simple_max) or _text.DASH,
        }
        for t in tasks
    ]
    return pd.DataFrame(
        rows,
        columns=[
            "project",
            "task",
            "runs",
            "running",
            "batch sizes",
            "units",
            "measured runs",
            "B_simple median",
            "B_simple range",
        ],
    )


# --- the critical batch size -----------------------------------------------------------------


def frontier_text(target: TargetResult) -> str:
    """The frontier in words: "16 → lr 0.1, 120 steps; 32 → lr 0.2, 64 steps"."""
    parts = []
    for p in target.points:
        lr = f"lr {p.lr:.3g}" if p.lr is not None else "lr not logged"
        parts.append(f"{_text.count(p.batch_size)} → {lr}, {_text.count(p.steps)} steps")
    return "; ".join(parts)


def target_warnings(target: TargetResult) -> list[str]:
    """The API's warnings on a target, and why B_simple at its loss is missing, if it is."""
    extra = [f"B_simple at this loss: {target.b_simple_reason}"] if target.b_simple_reason else []
    return [*target.warnings, *extra]


def target_table(report: CriticalBatchReport) -> pd.DataFrame:
    """One row per loss target. B_crit, S_min and E_min only where the fit is determined;
    otherwise "not determined" and the warnings say why."""
    units = report.units
    rows = []
    for t in report.targets:
        ok = t.determined and t.b_crit is not None
        rows.append(
            {
                "loss target": _text.target(t.target),
                "B_crit": _text.count(t.b_crit) if ok else "not determined",
                "B_crit 90% interval": _text.interval(t.b_crit_lo, t.b_crit_hi) if ok else "",
                "S_min (steps)": _text.count(t.s_min) if ok else "",
                f"E_min ({units})": _text.count(t.e_min) if ok else "",
                "B_simple at this loss": _text.count(t.b_simple) if t.b_simple is not None else "",
                "B_simple 90% interval": _text.interval(t.b_simple_lo, t.b_simple_hi),
                "warnings": " · ".join(target_warnings(t)),
                "frontier (batch → lr, steps)": frontier_text(t),
            }
        )
    return pd.DataFrame(rows)


def sweep_points(report: CriticalBatchReport) -> pd.DataFrame:
    """Every run that reached a target: target (label), run, batch_size, lr, steps, examples,
    frontier (whether the fit used it)."""
    rows = [
        {
            "target": f"loss {_text.target(t.target)}",
            "run": r.name,
            "batch_size": r.batch_size,
            "lr": r.lr,
            "steps": r.steps,
            "examples": r.examples,
            "frontier": r.frontier,
        }
        for t in report.targets
        for r in t.runs
        if r.steps is not None and r.examples is not None
    ]
    columns = ["target", "run", "batch_size", "lr", "steps", "examples", "frontier"]
    frame = pd.DataFrame(rows, columns=columns)
    frame["frontier"] = frame["frontier"].astype(bool)
    return frame


def sweep_curves(report: CriticalBatchReport) -> pd.DataFrame:
    """The fitted S-E hyperbola of every *determined* target (an undetermined fit is not
    drawn: its curve would look like an answer)."""
    rows = [
        {
            "target": f"loss {_text.target(t.target)}",
            "batch_size": c.batch_size,
            "steps": c.steps,
            "examples": c.examples,
        }
        for t in report.targets
        if t.determined
        for c in t.curve
    ]
    return pd.DataFrame(rows, columns=["target", "batch_size", "steps", "examples"])


def _clip(values: Sequence[float | None], floor: float, ceiling: float) -> list[float]:
    """Interval ends a log axis can draw: a lower end at or below 0 becomes ``floor``, a
    missing upper end ``ceiling`` (the tooltip still gives the true interval)."""
    out = []
    for v in values:
        if v is None or not math.isfinite(v):
            out.append(ceiling)
        elif v <= 0:
            out.append(floor)
        else:
            out.append(v)
    return out


def _bounds(values: Iterable[float | None]) -> tuple[float, float]:
    pos = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    if not pos:
        return 1.0, 10.0
    return min(pos) / 3.0, max(pos) * 3.0


def bcrit_vs_loss(report: CriticalBatchReport) -> pd.DataFrame:
    """B_crit of each determined target and B_simple at each target's loss, with intervals:
    loss, value, lo, hi, lo_shown, hi_shown, quantity, interval."""
    rows: list[dict[str, Any]] = []
    for t in report.targets:
        if t.determined and t.b_crit is not None:
            rows.append(
                {"loss": t.target, "value": t.b_crit, "lo": t.b_crit_lo, "hi": t.b_crit_hi}
                | {"quantity": B_CRIT}
            )
        if t.b_simple is not None:
            rows.append(
                {"loss": t.target, "value": t.b_simple, "lo": t.b_simple_lo, "hi": t.b_simple_hi}
                | {"quantity": B_SIMPLE_AT_LOSS}
            )
    frame = pd.DataFrame(rows, columns=["loss", "value", "lo", "hi", "quantity"])
    floor, ceiling = _bounds(r["value"] for r in rows)
    frame["lo_shown"] = _clip(list(frame["lo"]), floor, ceiling)
    frame["hi_shown"] = _clip(list(frame["hi"]), floor, ceiling)
    frame["interval"] = [
        _text.interval(lo, hi) or "unknown" for lo, hi in zip(frame["lo"], frame["hi"], strict=True)
    ]
    return frame


def tasks_b_simple_vs_b_crit(
    reports: Sequence[CriticalBatchReport],
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The paper's cross-task figure: one row per (task, target) whose fit is determined and
    whose B_simple at that loss is measured; and the targets left out, with why."""
    points: list[dict[str, Any]] = []
    left_out: list[dict[str, str]] = []
    for rep in reports:
        key = _text.task_key(rep.project, rep.task)
        for t in rep.targets:
            why = []
            if not (t.determined and t.b_crit is not None):
                why += t.warnings or ["B_crit is not determined"]
            if t.b_simple is None:
                why.append(f"B_simple at this loss: {t.b_simple_reason or 'not measured'}")
            if why:
                left_out.append(
                    {"task": key, "loss target": _text.target(t.target), "why": " · ".join(why)}
                )
                continue
            points.append(
                {
                    "task": key,
                    "target": t.target,
                    "units": rep.units,
                    "b_crit": t.b_crit,
                    "b_crit_lo": t.b_crit_lo,
                    "b_crit_hi": t.b_crit_hi,
                    "b_simple": t.b_simple,
                    "b_simple_lo": t.b_simple_lo,
                    "b_simple_hi": t.b_simple_hi,
                }
            )
        if not rep.targets:
            left_out.append(
                {"task": key, "loss target": "", "why": " · ".join(rep.warnings) or "no target"}
            )
    columns = ["task", "target", "units", "b_crit", "b_crit_lo", "b_crit_hi"]
    columns += ["b_simple", "b_simple_lo", "b_simple_hi"]
    frame = pd.DataFrame(points, columns=columns)
    floor, ceiling = _bounds(list(frame["b_crit"]) + list(frame["b_simple"]))
    for q in ("b_crit", "b_simple"):
        frame[f"{q}_lo_shown"] = _clip(list(frame[f"{q}_lo"]), floor, ceiling)
        frame[f"{q}_hi_shown"] = _clip(list(frame[f"{q}_hi"]), floor, ceiling)
        frame[f"{q}_interval"] = [
            _text.interval(lo, hi) or "unknown"
            for lo, hi in zip(frame[f"{q}_lo"], frame[f"{q}_hi"], strict=True)
        ]
    return frame, pd.DataFrame(left_out, columns=["task", "loss target", "why"])


# --- what-if ---------------------------------------------------------------------------------


def parallelism_rows(plan: ParallelismPlan) -> pd.DataFrame:
    """The plan's rows for charts: devices, batch_size, ratios, speed-ups, waste, label,
    ``ideal`` (speed-up = devices, the reference line) and ``past`` (beyond the device limit)."""
    rows = [
        {
            "devices": r.devices,
            "batch_size": r.batch_size,
            "steps_ratio": r.steps_ratio,
            "examples_ratio": r.examples_ratio,
            "speedup": r.speedup,
            "doubling_speedup": r.doubling_speedup,
            "waste": r.waste,
            "steps": r.steps,
            "hours": r.hours,
            "label": f"{r.devices:,} device{'s' if r.devices != 1 else ''}",
            "ideal": float(r.devices),
            "past": "past the limit" if r.devices > plan.device_limit else "each doubling pays",
        }
        for r in plan.rows
    ]
    return pd.DataFrame(rows)


def parallelism_table(plan: ParallelismPlan, units: str) -> pd.DataFrame:
    """The plan's rows as text."""
    word = _text.units_word(units)
    return pd.DataFrame(
        [
            {
                "devices": _text.count(r.devices),
                f"batch ({word})": _text.count(r.batch_size),
                "S / S_min": _text.ratio(r.steps_ratio),
                "E / E_min": _text.ratio(r.examples_ratio),
                "speed-up": _text.ratio(r.speedup),
                "this doubling": _text.ratio(r.doubling_speedup)
                if r.doubling_speedup is not None
                else "",
                "extra compute": _text.percent(r.waste),
                "steps": _text.count(r.steps) if r.steps is not None else "",
                "time": _text.hours(r.hours) if r.hours is not None else "",
            }
            for r in plan.rows
        ]
    )
