"""The What-if page's frames: the parallelism plan as chart rows and as a table."""

from __future__ import annotations

import pandas as pd

from noisescope import ParallelismPlan, ParallelismRow
from noisescope_dashboard import _text

#: How the chart's legend and the table name a row by ``ParallelismRow.past_limit``.
PAYS, PAST = "each doubling pays", "past the limit"


def limit_label(row: ParallelismRow) -> str:
    """A row as the chart's colour and the table's last column name it."""
    return PAST if row.past_limit else PAYS


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
            "past": limit_label(r),
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
                "this doubling": _text.ratio(r.doubling_speedup, limit=plan.min_speedup)
                if r.doubling_speedup is not None
                else "",
                "extra compute": _text.percent(r.waste),
                "steps": _text.whole(r.steps) if r.steps is not None else "",
                "time": _text.hours(r.hours) if r.hours is not None else "",
                "doubling": limit_label(r),
            }
            for r in plan.rows
        ]
    )
