"""The server's background work, two threads: the compactor compacts finished and long-silent
runs (``crud.runs_to_compact``, ``crud.compact_run``) every ``Settings.compact_every`` seconds;
the digest keeper stores the digest of every run that got samples since it last looked
(``crud.refresh_digests``: the task list and the run list read a run's window from it) every
``DIGEST_EVERY`` seconds, from start-up on.

Each worker process runs both; two compacting the same run take turns chunk by chunk (each
step locks the run's row and moves rows no other step holds), so more workers only mean more
checks; one digest keeper looks at a time (``db.try_exclusive``), the others skip. A failure
is logged and retried at the next round: nothing is lost by one (each step is one
transaction).
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta

from sqlalchemy import Engine

from noisescope_server import crud, db
from noisescope_server.utc import utcnow

log = logging.getLogger("noisescope_server")

#: Seconds between the digest keeper's looks, at least (a look that took longer is followed by
#: a pause as long: the keeper takes at most half a core): how far behind the task list's
#: digests of live runs fall (``TaskSummary.n_behind``; docs/benchmarks.md, the task list at
#: team size).
DIGEST_EVERY = 2.0
#: A look reads the sample counts of the runs written to since the previous look began, less
#: this margin (an ingest touches its run when its transaction begins, and commits later);
#: every ``compact_every`` seconds, and at the first look, those of every run. The counts of
#: all runs are every block of the database: read every 2 s they would cost the most.
TOUCHED_MARGIN = timedelta(seconds=60)


class Compactor:
    """``start()`` the threads; ``stop()`` ends them after the step each is in."""

    def __init__(
        self, engine: Engine, *, every: float, finished_after: float, quiet_after: float
    ) -> None:
        self.engine = engine
        self.every = every
        self.finished_after = finished_after
        self.quiet_after = quiet_after
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._loop, name="noisescope-compactor", daemon=True),
            threading.Thread(target=self._keep_digests, name="noisescope-digests", daemon=True),
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.round()
            except Exception:  # a database outage: the next round tries again
                log.exception("compaction round failed; retrying in %.0f s", self.every)

    def _keep_digests(self) -> None:
        period = min(self.every, DIGEST_EVERY)
        wait = period
        failing = False
        looked: datetime | None = None  # when the last look began (None: look at every run)
        whole_at = time.monotonic()
        while not self._stop.wait(wait):
            began = time.monotonic()
            if began - whole_at >= self.every:
                looked, whole_at = None, began
            start = utcnow()
            try:
                self.keep_digests(None if looked is None else looked - TOUCHED_MARGIN)
            except Exception:  # a database outage: the next look tries again
                if not failing:  # said once, not every DIGEST_EVERY seconds of the outage
                    log.exception("storing run digests failed; retrying until it works")
                failing = True
            else:
                if failing:
                    log.info("storing run digests works again")
                failing = False
                looked = start
            wait = max(period, time.monotonic() - began)

    def keep_digests(self, touched_since: datetime | None = None) -> int | None:
        """Store every stale digest (``crud.refresh_digests``: with ``touched_since``, of the
        runs written to since then); how many, or None where another worker's keeper is at it
        (one looks at a time: each look reads every window that moved, and N workers reading
        them all would cost N times the CPU)."""
        with db.try_exclusive(self.engine, "digests") as mine:
            if not mine:
                return None
            return crud.refresh_digests(
                self.engine, stop=self._stop.is_set, touched_since=touched_since
            )

    def round(self) -> int:
        """Compact every run that is due (each stores its digest); the samples moved."""
        moved = 0
        due = crud.runs_to_compact(
            self.engine, finished_after=self.finished_after, quiet_after=self.quiet_after
        )
        for run_id in due:
            if self._stop.is_set():
                break
            done = crud.compact_run(self.engine, run_id, stop=self._stop.is_set)
            if done.samples:
                log.info(
                    "compacted run %d: %d samples into %d chunks", run_id, done.samples, done.chunks
                )
            moved += done.samples
        return moved
