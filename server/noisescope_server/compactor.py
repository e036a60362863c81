"""The server's compactor: a thread that compacts finished and long-silent runs
(``crud.runs_to_compact``, ``crud.compact_run``) every ``Settings.compact_every`` seconds (the
first round ``FIRST_ROUND_AFTER`` seconds after start-up), and
then stores the digest of every run that got samples since the last round
(``crud.refresh_digests``: the task list and the run list read a run's window from it).

Each worker process runs one; two compacting the same run take turns chunk by chunk (each
step locks the run's row and moves rows no other step holds), so more workers only mean more
checks. A failure is logged and retried at the next round: nothing is lost by one (each step
is one transaction).
"""

from __future__ import annotations

import logging
import threading

from sqlalchemy import Engine

from noisescope_server import crud

log = logging.getLogger("noisescope_server")

#: Seconds from start-up to the first round (then every ``compact_every``): a server started
#: on a database whose runs got samples since its last round (a restart, an upgrade) stores
#: their digests within seconds, so the task list does not read every run's window for a
#: whole ``compact_every`` (docs/benchmarks.md, the task list at team size).
FIRST_ROUND_AFTER = 2.0


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
        self._thread = threading.Thread(target=self._loop, name="noisescope-compactor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        wait = min(self.every, FIRST_ROUND_AFTER)
        while not self._stop.wait(wait):
            wait = self.every
            try:
                self.round()
            except Exception:  # a database outage: the next round tries again
                log.exception("compaction round failed; retrying in %.0f s", self.every)

    def round(self) -> int:
        """Compact every run that is due and refresh stale digests; the samples moved."""
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
        if not self._stop.is_set():  # the runs that got samples since the last round
            crud.refresh_digests(self.engine, stop=self._stop.is_set)
        return moved
