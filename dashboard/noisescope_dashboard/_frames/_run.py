"""One run's frames: its series points, and its events and evaluations placed on the chosen x
axis."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from noisescope import EventRow, RunSeries, protocol
from noisescope_dashboard import _text

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
    if event.kind == protocol.BATCH_SIZE_EVENT_KIND and "batch_size" in payload:
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
NOT_MARKS = (protocol.EVAL_EVENT_KIND, protocol.NOTICE_EVENT_KIND)
#: The most batch-size changes and other marks the Run page draws (each a rule on every
#: chart), and the most evaluations its loss chart draws (as many as a series has points): a
#: run with more is read thinned by the server, every k-th, and the page says so.
MAX_MARKS = 200
MAX_EVALS = 2000


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
        if e.kind == protocol.EVAL_EVENT_KIND
        and protocol.finite_number(e.payload.get("loss")) is not None
    ]
    placed = _x_of(evals, points, x, t0)
    if x == "examples":  # an evaluation that says where it was has the last word
        said = [protocol.finite_number(e.payload.get("examples")) for e in evals]
        placed = [v if s is None else s for s, v in zip(said, placed, strict=True)]
    return pd.DataFrame(
        {
            "step": [e.step for e in evals],
            "loss": [float(e.payload["loss"]) for e in evals],
            "x": placed,
        },
        columns=["step", "loss", "x"],
    )
