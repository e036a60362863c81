"""The one write path: every row noisescope stores goes through this package.

Each public function runs in ONE transaction (``db.write_transaction``): a request either lands
completely or not at all, so a bad or interrupted request never leaves partial data. Requests
are checked first by ``noisescope_server.validate`` (re-exported here, as the write path's
input); failures raise the errors of ``noisescope_server.errors``.

- ``_runs``: projects, tasks and runs, and the run-row lock every write takes;
- ``_samples``: sample rows and their ``sample_block`` sums;
- ``_compact``: a finished run's rows into compressed chunks, and back for a late sample;
- ``_digests``: each run's digest (its current window and last loss), for the lists;
- ``_events``: run events;
- ``_tokens``: API tokens;
- ``_sql``: the dialect-specific statements, built once.
"""

from __future__ import annotations

from noisescope_server.crud._compact import Compacted, compact_run, runs_to_compact
from noisescope_server.crud._digests import refresh_digests
from noisescope_server.crud._events import EventIn, ingest_events
from noisescope_server.crud._runs import (
    FUTURE_TOLERANCE,
    RunIn,
    RunRef,
    delete_run,
    not_ahead,
    patch_run,
    touch_run,
    upsert_run,
)
from noisescope_server.crud._samples import ingest_samples
from noisescope_server.crud._tokens import TokenCreated, create_token, hash_token, revoke_token
from noisescope_server.validate import SampleBatch, check_run_uid, validate_samples

__all__ = [
    "FUTURE_TOLERANCE",
    "Compacted",
    "EventIn",
    "RunIn",
    "RunRef",
    "SampleBatch",
    "TokenCreated",
    "check_run_uid",
    "compact_run",
    "create_token",
    "delete_run",
    "hash_token",
    "ingest_events",
    "ingest_samples",
    "not_ahead",
    "patch_run",
    "refresh_digests",
    "revoke_token",
    "runs_to_compact",
    "touch_run",
    "upsert_run",
    "validate_samples",
]
