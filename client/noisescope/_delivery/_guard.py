"""``Guard``: the thread that keeps the crash-loss bound while a request hangs."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from noisescope._config import Settings
from noisescope._delivery._outbox import Outbox

logger = logging.getLogger("noisescope")


#: Seconds ``Guard.stop`` waits for a spill in progress to reach the disk.
STOP_WAIT = 5.0


class Guard:
    """A thread that spills while the sender's thread is stuck in a request."""

    def __init__(
        self,
        outbox: Outbox,
        settings: Settings,
        request_started: Callable[[], float | None],
        refused: Callable[[], bool],
    ) -> None:
        self.outbox = outbox
        self.settings = settings
        self._request_started = request_started
        self._refused = refused
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="noisescope-spool-guard")
        self._thread.daemon = True

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop, and wait (``STOP_WAIT`` at most) for a spill in progress: a run's status read
        after ``close`` would otherwise count those samples as still in memory."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(STOP_WAIT)

    def _main(self) -> None:
        """While a request hangs (a server that accepts but does not answer) the sender thread
        cannot spill; this thread does, so a process killed at any moment has every sample
        committed more than about ``batch_interval`` ago on the server or on disk."""
        period = self.settings.batch_interval / 4.0
        history: deque[tuple[float, int]] = deque()
        while not self._stop.wait(period):
            try:
                self._tick(history)
            except Exception as exc:  # the guard must never die either
                self.outbox._report(f"internal error: {type(exc).__name__}: {exc}", key="internal")
                logger.debug("noisescope spool guard error", exc_info=True)

    def _tick(self, history: deque[tuple[float, int]]) -> None:
        if self._refused() or not self.outbox.spool_usable():
            return
        now = time.monotonic()
        interval = self.settings.batch_interval
        taken, committed = self.outbox.progress()
        history.append((now, committed))
        behind = False  # rows committed over batch_interval ago still in memory
        while history and now - history[0][0] >= interval:
            behind = taken < history[0][1]
            history.popleft()
        started = self._request_started()
        hung = started is not None and now - started >= interval / 2.0
        if not hung and not behind:
            return
        if hung:
            self.outbox.spool_inflight()
        self.outbox.spill(force=True)
        self.outbox.spill_events()
