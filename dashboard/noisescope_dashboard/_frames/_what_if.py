"""The What-if page's frames: the parallelism plan as chart rows and as a table; the
critical batch sizes it may start from (``Estimate``) and which one it opens on."""

from __future__ import annotations

from dataclasses import dataclass

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


#: What the steps and time cells say while they cannot be known (in place of a number).
NEEDS_S_MIN = "needs S_min: pick a sweep fit"
NEEDS_STEP_TIME = "enter a step time"


def missing_steps_time(plan: ParallelismPlan) -> tuple[str, str]:
    """What the empty steps and time cells say: steps need S_min (only a sweep fit gives it),
    time needs S_min and a step time; empty where the number is there."""
    steps = NEEDS_S_MIN if plan.s_min is None else ""
    time = steps or (NEEDS_STEP_TIME if plan.step_time is None else "")
    return steps, time


#: The column of ``ParallelismRow.waste``: a share *of the compute spent* (1 − E_min/E), so
#: E/E_min 1.5× is "33% of it", never "extra compute 33%" beside the 1.5× (issue 56).
BEYOND = "compute beyond E_min"


def beyond_minimum(waste: float | None) -> str:
    """``ParallelismRow.waste`` as the share of the compute spent ("33% of it")."""
    shown = _text.percent(waste)
    return shown if shown == _text.DASH else f"{shown} of it"


def parallelism_table(plan: ParallelismPlan, units: str) -> pd.DataFrame:
    """The plan's rows as text; the steps and time cells say what they need while empty."""
    word = _text.units_word(units)
    no_steps, no_time = missing_steps_time(plan)
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
                BEYOND: beyond_minimum(r.waste),
                "steps": _text.whole(r.steps) if r.steps is not None else no_steps,
                "time": _text.hours(r.hours) if r.hours is not None else no_time,
                "doubling": limit_label(r),
            }
            for r in plan.rows
        ]
    )


@dataclass(frozen=True)
class Estimate:
    """Where the critical batch size comes from, in words, its value (and S_min), and which
    quantity it is (``recommend.REFERENCES``), for the API's sentences."""

    label: str
    b_crit: float
    s_min: float | None
    explain: str
    reference: str = "B_crit"
    #: What the sweep says this number should be read with (a determined target's warnings).
    warnings: tuple[str, ...] = ()


def default_source(options: dict[str, Estimate]) -> str | None:
    """The source the page opens on: the sweep fit at the lowest loss target that carries no
    warning, else at any target, else the first option (None: no option)."""
    fits = [k for k in options if k.startswith("bcrit:")]  # in the sweep's order, lowest last
    clean = [k for k in fits if not options[k].warnings]
    if clean or fits:
        return (clean or fits)[-1]
    return next(iter(options), None)


def default_reason(options: dict[str, Estimate], chosen: str) -> str | None:
    """Why the page opened on ``chosen`` (its default) when a lower loss target's fit was
    passed over: that one carries the sweep's warnings. None when nothing was passed over."""
    fits = [k for k in options if k.startswith("bcrit:")]
    if chosen not in fits or chosen == fits[-1]:
        return None
    lower = fits[fits.index(chosen) + 1 :]
    passed = "; ".join(
        f"at loss {k.split(':', 1)[1]} B_crit is {_text.count(options[k].b_crit)}" for k in lower
    )
    return (
        f"Opened at loss {chosen.split(':', 1)[1]}: the lowest loss target whose B_crit the "
        f"sweep gives without warnings ({passed}, with warnings; pick it above to read it with "
        "them)."
    )
