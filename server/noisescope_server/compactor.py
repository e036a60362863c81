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

from sqlalchemy import Engine

from noisescope_server import crud, db

log = logging.getLogger("noisescope_server")

#: Seconds between the digest keeper's looks, at least (a look that took longer is followed by
#: a pause as long: the keeper takes at most half a core): how far behind the task list's
#: digests of live runs fall (``TaskSummary.n_behind``; docs/benchmarks.md, the task list at
#: team size).
DIGEST_EVERY = 2.0


class Compactor:
    """``start()`` the thread; ``stop()`` ends it after the step it is in."""

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
        wait = min(self.every, DIGEST_EVERY)
        failing = False
        while not self._stop.wait(wait):
            began = time.monotonic()
            try:
                self.keep_digests()
            except Exception:  # a database outage: the next look tries again
                if not failing:  # said once, not every DIGEST_EVERY seconds of the outage
                    log.exception("storing run digests failed; retrying until it works")
                failing = True
            else:
                if failing:
                    log.info("storing run digests works again")
                failing = False
            wait = max(min(self.every, DIGEST_EVERY), time.monotonic() - began)

    def keep_digests(self) -> int | None:
        """Store every stale digest (``crud.refresh_digests``); how many, or None where another
        worker's keeper is at it (one looks at a time: each look reads every window that
        moved, and N workers reading them all would cost N times the CPU)."""
        with db.try_exclusive(self.engine, "digests") as mine:
            if not mine:
                return None
            return crud.refresh_digests(self.engine, stop=self._stop.is_set)

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
