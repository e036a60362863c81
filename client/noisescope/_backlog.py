"""What is committed but not yet acknowledged, and its way to the spool.

``Backlog`` holds the memory side of a run's delivery: the buffer the training thread appends
to, the events queued by ``Run.log_event``, the batch in the request being sent, and every
move of those to the on-disk spool (a spill during an outage, a copy of a hung request's
batch, the older half of a full buffer, what is left at exit). ``Guard`` is the thread that
keeps the crash-loss bound while the sender's own thread is stuck in a request.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from noisescope._config import Settings
from noisescope._records import Sample, json_safe, rows_to_columns
from noisescope._spool import Columns, RunSpool

logger = logging.getLogger("noisescope")

#: How the backlog reports a problem: (message, key of the one warning or None, log level).
Report = Callable[..., None]


class Backlog:
    """The samples and events of one run that the server has not acknowledged, in memory.
    Thread-safe: the training thread, the sender and the guard all use it."""

    def __init__(
        self,
        settings: Settings,
        buffer: deque[Sample],
        spool: RunSpool | None,
        series_prefix: str,
        report: Report,
    ) -> None:
        self.settings = settings
        self.buffer = buffer
        self.spool = spool
        self.series_prefix = series_prefix
        self._report = report
        self.lock = threading.Lock()
        #: The batch in the request being sent, and whether the guard already spooled a copy.
        self.inflight: list[Sample] | None = None
        self.inflight_spooled = False
        #: Events in the request being sent (a copy may be spooled by the guard likewise).
        self.inflight_events: list[Any] | None = None
        self.inflight_events_spooled = False
        #: Samples taken from the buffer on their way to the spool (counted as queued meanwhile).
        self.spilling = 0
        #: Samples taken from the buffer so far (the guard: how far behind the sender is).
        self.taken = 0
        #: Events (``Run.log_event``) waiting to be sent.
        self.events: deque[dict[str, Any]] = deque(maxlen=10_000)
        #: Samples lost, by kind of reason: (count, why). Several threads drop: one lock.
        self._drops: dict[str, tuple[int, str]] = {}
        self._drops_lock = threading.Lock()
        self.dropped_events = 0
        self._last_spill = time.monotonic()
        #: When a spool write failed (read-only or missing directory), batches are held in
        #: memory (bounded by ``memory_max``) until this time, then the disk is tried again.
        self._spool_retry_at = 0.0
        #: Why the spool last refused samples (for the message about dropped ones).
        self._spool_trouble: str | None = None

    @property
    def dropped(self) -> int:
        with self._drops_lock:
            return sum(count for count, _ in self._drops.values())

    def drops(self) -> list[tuple[int, str]]:
        """(count, why) of the samples lost, each kind of reason once (its latest wording)."""
        with self._drops_lock:
            return list(self._drops.values())

    def drop(self, count: int, kind: str, why: str) -> None:
        """Count ``count`` samples as lost; ``why`` completes "... samples dropped because"."""
        if count:
            with self._drops_lock:
                self._drops[kind] = (self._drops.get(kind, (0, ""))[0] + count, why)

    def queued(self) -> int:
        """Samples in memory: the buffer, the batch in a request (unless spooled), spilling."""
        with self.lock:
            inflight = self.inflight if not self.inflight_spooled else None
            return len(self.buffer) + (len(inflight) if inflight else 0) + self.spilling

    def in_memory(self) -> bool:
        """Whether any sample or event in a request is held only in memory."""
        return bool(self.buffer or self.inflight or self.spilling or self.inflight_events)

    def begin_events(self, batch: list[Any]) -> None:
        with self.lock:
            self.inflight_events, self.inflight_events_spooled = batch, False

    def end_events(self) -> bool:
        """The events request is over; True if the guard spooled its batch meanwhile."""
        with self.lock:
            spooled = self.inflight_events_spooled
            self.inflight_events, self.inflight_events_spooled = None, False
            return spooled

    def take(self, limit: int, sending: bool) -> list[Sample]:
        """Up to ``limit`` rows, oldest first: the batch of the next request (``sending``) or
        rows on their way to the spool (release them with ``_done_spilling``)."""
        with self.lock:
            rows: list[Sample] = []
            popleft = self.buffer.popleft
            try:
                for _ in range(limit):
                    rows.append(popleft())
            except IndexError:
                pass
            self.taken += len(rows)
            if sending:
                self.inflight, self.inflight_spooled = rows, False
            else:
                self.spilling += len(rows)
            return rows

    def done_inflight(self) -> None:
        with self.lock:
            self.inflight, self.inflight_spooled = None, False

    def done_spilling(self, count: int) -> None:
        with self.lock:
            self.spilling -= count

    def inflight_was_spooled(self) -> bool:
        """Whether the guard spooled the batch in the request (then the spool's replay, not
        this request, counts it as sent; a failed request need not spool it again)."""
        with self.lock:
            return self.inflight_spooled

    # -- overflow: a burst faster than the sender --------------------------------------------
    def make_room(self) -> bool:
        """On the training thread, when the memory buffer is full: move its older half to the
        spool (back-pressure: the caller waits for the disk). False if the spool cannot take
        it (then the caller counts the overflow as dropped)."""
        if not self.spool_usable():
            return False
        target = self.settings.memory_max // 2
        while len(self.buffer) > target:
            rows = self.take(min(self.settings.batch_max, len(self.buffer) - target), False)
            if not rows:
                break
            columns, invalid = rows_to_columns(rows, self.series_prefix)
            self.count_invalid(invalid)
            if columns["seq"] and not self.to_spool(columns, hold=True):
                self.buffer.extendleft(reversed(rows))
                self.done_spilling(len(rows))
                return False
            self.done_spilling(len(rows))
        return True

    def spool_problem(self) -> str:
        """Why the spool cannot take samples now (for a message about dropped ones)."""
        if self.spool is None:
            return "there is no spool (see the warning at init)"
        return self._spool_trouble or "the spool could not take them"

    def spill(self, force: bool) -> None:
        """Move buffered rows to the spool: all of them if ``force`` or ``batch_interval`` has
        passed since the last spill (so an outage keeps at most that much in memory), else
        whole batches only. Without a usable spool the rows stay in memory, where the hot path
        bounds them at ``memory_max`` (counting the overflow as dropped)."""
        if not self.spool_usable():
            return
        now = time.monotonic()
        if now - self._last_spill >= self.settings.batch_interval:
            force = True
        if self.buffer and force:
            self._last_spill = now
        while self.buffer and (force or len(self.buffer) >= self.settings.batch_max):
            rows = self.take(self.settings.batch_max, sending=False)
            columns, invalid = rows_to_columns(rows, self.series_prefix)
            self.count_invalid(invalid)
            if columns["seq"] and not self.to_spool(columns, hold=invalid == 0):
                self.buffer.extendleft(reversed(rows))  # no disk: keep them in memory
                self.done_spilling(len(rows))
                return
            self.done_spilling(len(rows))

    def spool_usable(self) -> bool:
        return self.spool is not None and time.monotonic() >= self._spool_retry_at

    def spill_everything(self) -> None:
        """Called on the caller's thread at close when the wait ran out."""
        self._spool_retry_at = 0.0  # last chance: try the disk
        # The batch being sent right now: a copy (the server ignores a duplicate), counted as
        # spooled only, as a hung request's is.
        self.spool_inflight()
        self.spill(force=True)
        with self.lock:  # what neither the server nor the disk took is lost: count it
            left = len(self.buffer)
            self.buffer.clear()
        if left:
            self.drop(left, "lost-at-exit", "they could not be sent or spooled at finish")
            self._report(f"{left} samples could not be sent or spooled", key="lost-at-exit")
        self.spill_events()

    def to_spool(self, columns: Columns, count_dropped: bool = True, hold: bool = False) -> bool:
        """Append a batch to the spool. With ``hold``, a batch the disk cannot take (no spool,
        I/O error) is not counted dropped: False tells the caller to keep it in memory."""
        count = len(columns["seq"])
        if self.spool is None or not self.spool_usable():
            if hold:
                return False
            if count_dropped:
                self.drop(count, "spool", self.spool_problem())
            return True
        try:
            ok = self.spool.append(columns)
        except OSError as exc:
            self._spool_retry_at = time.monotonic() + 5.0
            self._spool_trouble = f"the spool {self.spool.dir} cannot be written ({exc})"
            self._report(
                f"cannot write spool {self.spool.dir}: {exc}; keeping samples in memory "
                f"(up to {self.settings.memory_max}) while the server is unreachable",
                key="spool-io",
                level=logging.WARNING,
            )
            if hold:
                return False
            if count_dropped:
                self.drop(count, "spool", self._spool_trouble)
            return True
        if not ok and count_dropped:
            self._spool_trouble = (
                f"the spool limit of {self.spool.max_bytes} bytes is reached at {self.spool.dir}"
            )
            self.drop(count, "spool-limit", self._spool_trouble)
            self._report(
                f"{self._spool_trouble}; newer samples are dropped, {self.dropped} so far "
                "(raise spool_max_bytes or run `noisescope sync`)",
                key="spool-full",
                level=logging.WARNING,
            )
        return True

    def count_invalid(self, invalid: int) -> None:
        if invalid:
            why = "they had non-finite or non-numeric squared norms or batch sizes"
            self.drop(invalid, "invalid", why)
            self._report(
                f"{invalid} samples had non-finite or non-numeric squared norms/batch sizes",
                key="invalid",
                level=logging.WARNING,
            )

    def spill_events(self) -> None:
        """Events go to the spool too when the run ends offline or unreachable."""
        if self.spool is None or not self.events:
            return
        batch: list[Any] = []
        with contextlib.suppress(IndexError):
            while True:
                batch.append(json_safe(self.events.popleft()))
        if batch:
            try:
                ok = self.spool.append_record({"events": batch})
            except OSError:
                ok = False
            if not ok:
                self.dropped_events += len(batch)

    def spool_inflight(self) -> None:
        """A copy of the batch (and the events) in a hung request to the spool, once: a
        duplicate is harmless (the server ignores a (run, seq) it has)."""
        with self.lock:
            rows = self.inflight if not self.inflight_spooled else None
            self.inflight_spooled = self.inflight_spooled or rows is not None
            events = self.inflight_events if not self.inflight_events_spooled else None
            self.inflight_events_spooled = self.inflight_events_spooled or events is not None
        if rows:
            columns, _ = rows_to_columns(rows, self.series_prefix)
            if columns["seq"] and not self.to_spool(columns, hold=True):
                with self.lock:
                    self.inflight_spooled = False  # not on disk after all
        if events:
            try:
                ok = self.spool is not None and self.spool.append_record({"events": events})
            except OSError:
                ok = False
            if not ok:
                with self.lock:
                    self.inflight_events_spooled = False


class Guard:
    """A thread that spills while the sender's thread is stuck in a request."""

    def __init__(
        self,
        backlog: Backlog,
        settings: Settings,
        request_started: Callable[[], float | None],
        refused: Callable[[], bool],
    ) -> None:
        self.backlog = backlog
        self.settings = settings
        self._request_started = request_started
        self._refused = refused
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="noisescope-spool-guard")
        self._thread.daemon = True

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

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
                self.backlog._report(f"internal error: {type(exc).__name__}: {exc}", key="internal")
                logger.debug("noisescope spool guard error", exc_info=True)

    def _tick(self, history: deque[tuple[float, int]]) -> None:
        if self._refused() or not self.backlog.spool_usable():
            return
        now = time.monotonic()
        interval = self.settings.batch_interval
        with self.backlog.lock:
            taken, committed = self.backlog.taken, self.backlog.taken + len(self.backlog.buffer)
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
            self.backlog.spool_inflight()
        self.backlog.spill(force=True)
        self.backlog.spill_events()
