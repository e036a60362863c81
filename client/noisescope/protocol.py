"""The public contract between the client and the server (and the dashboard): what travels,
in one module both sides import.

- the wire format: the API prefix and paths, the limits, the run-id rule, the JSON bounds;
- the sample schema: ``SAMPLE_FIELDS``, one declarative table (name, type, nullable, range,
  block aggregates) from which the wire columns, validation, storage, the block sums and the
  OpenAPI schema derive, or against which they are checked at import (DEVELOPERS.md, adding a
  sample field);
- the run body (``RunBody``, ``run_body``) and the event kinds with a meaning;
- the answer types: the read API's answers, built by the server, decoded by ``noisescope.Api``;
- the number format of every message (the API's sentences and the dashboard agree on it);
- the one rule that keeps secrets out of messages and logs (``redact_url``, ``redact_text``:
  a URL's password, ``?token=``), which the server's access log and the dashboard apply too.

The server and the dashboard import the client only through its public modules (this one,
``estimators``, ``sweep``, ``schedule``, ``recommend``, ``forecast``, ``cli`` and the package
itself); ``tests/test_layout.py`` holds the allow-list. The definitions live in the client's
private modules (``_wire``, ``_results``, ``_format``, ``_redact``, ``_sample_rule``),
re-exported here unchanged. This module is the bottom of the client: it and what it imports
import nothing else of it (not the read client ``_api``, not ``sweep``, not the delivery
path), which ``tests/test_layout.py`` checks on the source and in a fresh interpreter.
"""

from __future__ import annotations

from noisescope._format import count as format_count
from noisescope._format import ratio as format_ratio
from noisescope._format import ratio_beside as format_ratio_beside
from noisescope._format import whole as format_whole
from noisescope._redact import redact_text, redact_url
from noisescope._results import (
    BranchPointResult,
    EventRow,
    ParallelismPlan,
    ParallelismRow,
    RecommendationResult,
    RunBranches,
    RunSeries,
    RunSummary,
    SeriesInfo,
    SeriesPoint,
    TaskSummary,
)
from noisescope._sample_rule import sample_problem
from noisescope._wire import (
    API_PREFIX,
    BATCH_SIZE_EVENT_KIND,
    BLOCK_AGGREGATES,
    BLOCK_COLUMNS,
    BLOCK_KEY,
    BRANCH_EVENT_KIND,
    CRASH_AFTER,
    DERIVED_COLUMNS,
    EVAL_EVENT_KIND,
    EVENT_KINDS,
    FIELDS_BY_NAME,
    HEARTBEAT_INTERVAL,
    LOGGED_KEYWORD,
    LOGGED_POSITIONAL,
    MAX_BODY_BYTES,
    MAX_EVENT_KIND_LENGTH,
    MAX_EVENTS_PER_REQUEST,
    MAX_JSON_BYTES,
    MAX_JSON_DEPTH,
    MAX_NAME_LENGTH,
    MAX_RUNS_LISTED,
    MAX_SAMPLES_PER_REQUEST,
    MAX_SUMMED,
    MAX_TAGS,
    NOTICE_EVENT_KIND,
    NULLABLE_COLUMNS,
    READ_COLUMNS,
    REQUIRED_COLUMNS,
    RUN_BODY_FIELDS,
    RUN_ID_PATTERN,
    RUN_STATUSES,
    SAMPLE_COLUMNS,
    SAMPLE_FIELDS,
    SAMPLE_RANGES,
    STORED_COLUMNS,
    TIME_RANGE,
    UNITS,
    Aggregate,
    RunBody,
    SampleField,
    events_path,
    finite_number,
    heartbeat_path,
    json_depth,
    run_body,
    run_id_problem,
    run_ids_matching,
    run_page_url,
    runs_path,
    samples_path,
    units_problem,
)

__all__ = [
    "API_PREFIX",
    "BATCH_SIZE_EVENT_KIND",
    "BLOCK_AGGREGATES",
    "BLOCK_COLUMNS",
    "BLOCK_KEY",
    "BRANCH_EVENT_KIND",
    "CRASH_AFTER",
    "DERIVED_COLUMNS",
    "EVAL_EVENT_KIND",
    "EVENT_KINDS",
    "FIELDS_BY_NAME",
    "HEARTBEAT_INTERVAL",
    "LOGGED_KEYWORD",
    "LOGGED_POSITIONAL",
    "MAX_BODY_BYTES",
    "MAX_EVENTS_PER_REQUEST",
    "MAX_EVENT_KIND_LENGTH",
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_NAME_LENGTH",
    "MAX_RUNS_LISTED",
    "MAX_SAMPLES_PER_REQUEST",
    "MAX_SUMMED",
    "MAX_TAGS",
    "NOTICE_EVENT_KIND",
    "NULLABLE_COLUMNS",
    "READ_COLUMNS",
    "REQUIRED_COLUMNS",
    "RUN_BODY_FIELDS",
    "RUN_ID_PATTERN",
    "RUN_STATUSES",
    "SAMPLE_COLUMNS",
    "SAMPLE_FIELDS",
    "SAMPLE_RANGES",
    "STORED_COLUMNS",
    "TIME_RANGE",
    "UNITS",
    "Aggregate",
    "BranchPointResult",
    "EventRow",
    "ParallelismPlan",
    "ParallelismRow",
    "RecommendationResult",
    "RunBody",
    "RunBranches",
    "RunSeries",
    "RunSummary",
    "SampleField",
    "SeriesInfo",
    "SeriesPoint",
    "TaskSummary",
    "events_path",
    "finite_number",
    "format_count",
    "format_ratio",
    "format_ratio_beside",
    "format_whole",
    "heartbeat_path",
    "json_depth",
    "redact_text",
    "redact_url",
    "run_body",
    "run_id_problem",
    "run_ids_matching",
    "run_page_url",
    "runs_path",
    "sample_problem",
    "samples_path",
    "units_problem",
]
