"""The read side: the one place the HTTP query API reads stored runs from.

Every function takes an ``Engine`` and returns plain frozen dataclasses (``noisescope.protocol``,
the same classes ``noisescope.Api`` decodes), so the server, the dashboard and a notebook hold
the very same fields. Aggregation happens in SQL: a series is bucketed to at most
``max_points`` buckets of *exact* sums of the per-sample unbiased estimates |𝒢|^2 and 𝒮
(docs/science.md, two-batch estimator); B_simple = sum 𝒮 / sum |𝒢|^2, its interval (block
jackknife + Fieller), every window and every smoother are computed afterwards by
``noisescope.estimators``, to which these modules hand the sums they read. Long runs are read
from ``sample_block`` (pre-summed blocks of 64 consecutive samples maintained at ingest), short
ones from ``sample`` directly.

``project_scope`` (a project id) restricts every function to one project; the HTTP layer sets
it from the caller's token. A run outside the scope raises ``errors.Forbidden``.

- ``_runs``: the run list and one run's summary;
- ``_current``: a run's current B_simple (its trailing window);
- ``_series``: one run's bucketed series, smoothed on request (``estimators.trailing_windows``);
- ``_buckets``: bucketed sums of several runs at once;
- ``_compare``: several runs' series for the comparison charts;
- ``_tasks``: projects and the per-task summary;
- ``_sweeps``: what a task's batch-size sweep is made of (``noisescope_server.sweeps``
  assembles it for ``noisescope.sweep``);
- ``_branches``: what a run's branch points are made of (``noisescope_server.branches``
  assembles them);
- ``_raw``: a run's events (of some kinds, at most so many) and counts by kind, and its raw
  samples as CSV;
- ``_common``: what they share (interval level, run status and row, scope check, tuple fetch,
  the archived-runs filter: archived runs are left out of every list unless asked for).
"""

from __future__ import annotations

from noisescope.protocol import (
    EventRow,
    RunSeries,
    RunSummary,
    SeriesInfo,
    SeriesPoint,
    TaskSummary,
)
from noisescope_server.queries._branches import RunBranchRows, read_run_branches
from noisescope_server.queries._buckets import BucketSums, bucket_sums
from noisescope_server.queries._common import (
    ARCHIVED_CHOICES,
    LEVEL,
    MIN_EVALS,
    Archived,
    archived_filter,
    finite_number,
    run_status,
)
from noisescope_server.queries._compare import compare_series
from noisescope_server.queries._raw import event_counts, raw_samples_csv, run_events
from noisescope_server.queries._runs import (
    get_run,
    list_runs,
    run_digests,
    sample_counts,
    stale_digests,
)
from noisescope_server.queries._series import (
    XAxis,
    run_series,
    series_names,
    smooth_series,
)
from noisescope_server.queries._sweeps import TaskSweep, read_task_sweep
from noisescope_server.queries._tasks import STALE_READ_LIMIT, list_projects, task_summaries

__all__ = [
    "ARCHIVED_CHOICES",
    "LEVEL",
    "MIN_EVALS",
    "STALE_READ_LIMIT",
    "Archived",
    "BucketSums",
    "EventRow",
    "RunBranchRows",
    "RunSeries",
    "RunSummary",
    "SeriesInfo",
    "SeriesPoint",
    "TaskSummary",
    "TaskSweep",
    "XAxis",
    "archived_filter",
    "bucket_sums",
    "compare_series",
    "event_counts",
    "finite_number",
    "get_run",
    "list_projects",
    "list_runs",
    "raw_samples_csv",
    "read_run_branches",
    "read_task_sweep",
    "run_digests",
    "run_events",
    "run_series",
    "run_status",
    "sample_counts",
    "series_names",
    "smooth_series",
    "stale_digests",
    "task_summaries",
]
