"""The API's answers laid out as the small frames the charts and tables take.

Arrangement only: columns renamed, numbers formatted as text for tables, marks placed on the
chosen x axis, the progress axis (a point's step over its run's last step), interval ends
clipped to what a log axis can draw. No estimate is made here: every value is the API's.

- ``_run``: one run's series points, event marks and evaluation points;
- ``_runs``: the run and task tables and several runs' points;
- ``_critical``: the critical batch size (targets, sweep points and curves, B_crit vs B_simple);
- ``_what_if``: the parallelism plan.
"""

from __future__ import annotations

from noisescope_dashboard._frames._critical import (
    B_CRIT,
    B_SIMPLE_AT_LOSS,
    bcrit_vs_loss,
    frontier_table,
    frontier_text,
    sweep_curves,
    sweep_points,
    target_table,
    target_warnings,
    tasks_b_simple_vs_b_crit,
    warnings_cell,
)
from noisescope_dashboard._frames._run import (
    MAX_EVALS,
    MAX_MARKS,
    NOT_MARKS,
    eval_points,
    event_marks,
    series_points,
    time_origin,
)
from noisescope_dashboard._frames._runs import (
    BAND_BINS,
    band_points,
    compare_points,
    group_label,
    left_out_why,
    loss_points,
    runs_table,
    task_table,
)
from noisescope_dashboard._frames._what_if import (
    BEYOND,
    NEEDS_S_MIN,
    NEEDS_STEP_TIME,
    Estimate,
    beyond_minimum,
    default_reason,
    default_source,
    parallelism_rows,
    parallelism_table,
)

__all__ = [
    "BAND_BINS",
    "BEYOND",
    "B_CRIT",
    "B_SIMPLE_AT_LOSS",
    "MAX_EVALS",
    "MAX_MARKS",
    "NEEDS_STEP_TIME",
    "NEEDS_S_MIN",
    "NOT_MARKS",
    "Estimate",
    "band_points",
    "bcrit_vs_loss",
    "beyond_minimum",
    "compare_points",
    "default_reason",
    "default_source",
    "eval_points",
    "event_marks",
    "frontier_table",
    "frontier_text",
    "group_label",
    "left_out_why",
    "loss_points",
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
    "warnings_cell",
]
