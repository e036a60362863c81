"""The one owner of what is committed but not yet acknowledged, and of its way to the spool.

``Outbox`` holds the memory side of a run's delivery: the buffer of committed samples (the
Run hands it each finished step with ``commit``; the outbox numbers the samples and keeps
them), the events queued by ``Run.log_event``, the batch in the request being sent, and every
move of those to the on-disk spool (a spill during an outage, a copy of a hung request's
batch, the older half of a full buffer, what is left at exit).

Threads: ``commit`` runs on whichever thread commits a step, one at a time (the Run commits
under its own lock); it only appends at the buffer's tail, an atomic ``deque.append``, so the
training thread never waits for the outbox's lock in the common case. Every other move of
rows (take, put back, clear) is made under ``lock``, by the sender or the guard.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from noisescope._config import Settings
from noisescope._records import Sample, json_safe, new_sample, rows_to_columns
from noisescope._spool import Columns, RunSpool

logger = logging.getLogger("noisescope")

#: How the outbox reports a problem: (message, key of the one warning or None, log level).
Report = Callable[..., None]

#: Events held in memory at most; beyond it the older half goes to the spool (or, with no
#: usable spool, a new event is dropped and counted).
EVENTS_MAX = 10_000
#: Events per request, and per spool record (a record is replayed as one request).
EVENTS_PER_REQUEST = 1000


class Outbox:
    """The samples and events of one run that the server has not acknowledged, in memory.
    Thread-safe: the training thread, the sender and the guard all use it."""

    def __init__(
        self,
        settings: Settings,
        spool: RunSpool | None,
        series_prefix: str,
        report: Report,
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        self.settings = settings
        self.spool = spool
        self.series_prefix = series_prefix
        self._report = report
        self._wake = wake
        self._memory_max = settings.memory_max
        self._batch_max = settings.batch_max
        self._buffer: deque[Sample] = deque()
        self.lock = threading.Lock()
        # seq = local index · stride + offset: unique across ranks when all ranks send.
        self._seq_stride = settings.world_size if settings.all_ranks else 1
        self._seq = settings.rank if settings.all_ranks else 0
        #: The batch in the request being sent, and whether the guard already spooled a copy.
        self.inflight: list[Sample] | None = None
        self.inflight_spooled = False
        #: Events in the request being sent (a copy may be spooled by the guard likewise).
        self.inflight_events: list[Any] | None = None
        self.inflight_events_spooled = False
        #: Held while the guard copies the request in flight to the spool.
        self._copying = threading.Lock()
        #: Samples taken from the buffer on their way to the spool (counted as queued meanwhile).
        self.spilling = 0
        #: Samples taken from the buffer so far (the guard: how far behind the sender is).
        self.taken = 0
        #: Events (``Run.log_event``) waiting to be sent.
        self._events: deque[dict[str, Any]] = deque()
        #: Samples neither memory nor the spool could take when they were committed.
        self.overflow = 0
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

    # -- the training thread's side -------------------------------------------------------------
    def commit(self, records: Iterable[list[Any]]) -> None:
        """Number a finished step's records (a ``Sample``'s fields after ``seq``) and keep
        them. A full buffer first moves its older half to the spool (the caller waits for the
        disk); a record neither can take is counted and said once. Wakes the sender when a
        batch is ready."""
        rows = self._buffer
        before = len(rows)
        seq = self._seq
        stride = self._seq_stride
        for record in records:
            if len(rows) >= self._memory_max and not self._make_room():
                self.overflow += 1
                continue
            rows.append(new_sample((seq, *record)))
            seq += stride
        self._seq = seq
        if before < self._batch_max <= len(rows):
            self._wake()

    def __len__(self) -> int:
        """Samples in the buffer (not counting a batch in a request or on its way to disk)."""
        return len(self._buffer)

    def add_event(self, event: dict[str, Any]) -> None:
        """Queue an event; a full queue first moves its older half to the spool (the caller
        waits for the disk, as for samples); one neither can take is counted and said once."""
        if len(self._events) >= EVENTS_MAX and not self._events_room():
            self.dropped_events += 1
            if self.dropped_events == 1:
                self._report(
                    f"{EVENTS_MAX} events wait in memory and {self.spool_problem()}: dropping "
                    "new events (counted in status().dropped_events)",
                    key="events-full",
                    level=logging.WARNING,
                )
            return
        self._events.append(event)
        self._wake()

    def drop_event(self, problem: str) -> None:
        """An event the server would refuse: counted, and said once."""
        self.dropped_events += 1
        self._report(
            f"an event was not recorded: {problem} (status().dropped_events counts them)",
            key="event-invalid",
            level=logging.WARNING,
        )

    def _events_room(self) -> bool:
        """Move the older half of the queued events to the spool; False if it cannot."""
        if self.spool is None or not self.spool_usable():
            return False
        while len(self._events) > EVENTS_MAX // 2:
            with self.lock:
                count = min(len(self._events) - EVENTS_MAX // 2, EVENTS_PER_REQUEST)
                batch = [json_safe(self._events.popleft()) for _ in range(max(0, count))]
            try:
                ok = self.spool.append_record({"events": batch})
            except OSError:
                ok = False
            if not ok:
                with self.lock:
                    self._events.extendleft(reversed(batch))
                return len(self._events) < EVENTS_MAX
        return True

    def _make_room(self) -> bool:
        if self.make_room():
            return True
        if self.overflow == 0:
            logger.warning(
                "noisescope: the memory buffer is full (memory_max=%d) and %s: dropping "
                "samples (counted in status().dropped)",
                self._memory_max,
                self.spool_problem(),
            )
        return False

    # -- accounting -----------------------------------------------------------------------------
    @property
    def dropped(self) -> int:
        return sum(count for count, _ in self.drops())

    def drops(self) -> list[tuple[int, str]]:
        """(count, why) of the samples lost, each kind of reason once (its latest wording)."""
        overflow = (
            self.overflow,
            f"the memory buffer was full (memory_max={self._memory_max}) and "
            f"{self.spool_problem()}",
        )
        with self._drops_lock:
            return [overflow, *self._drops.values()]

    def drop(self, count: int, kind: str, why: str) -> None:
        """Count ``count`` samples as lost; ``why`` completes "... samples dropped because"."""
        if count:
            with self._drops_lock:
                self._drops[kind] = (self._drops.get(kind, (0, ""))[0] + count, why)

    def queued(self) -> int:
        """Samples in memory: the buffer, the batch in a request (unless spooled), spilling."""
        with self.lock:
            inflight = self.inflight if not self.inflight_spooled else None
            return len(self._buffer) + (len(inflight) if inflight else 0) + self.spilling

    def in_memory(self) -> bool:
        """Whether any sample or event in a request is held only in memory."""
        return bool(self._buffer or self.inflight or self.spilling or self.inflight_events)

    def has_events(self) -> bool:
        return bool(self._events)

    def progress(self) -> tuple[int, int]:
        """(samples taken from the buffer so far, samples committed so far)."""
        with self.lock:
            return self.taken, self.taken + len(self._buffer)

    # -- the sender's side: batches -------------------------------------------------------------
    def take(self, limit: int, sending: bool) -> list[Sample]:
        """Up to ``limit`` rows, oldest first: the batch of the next request (``sending``:
        release it with ``done_inflight``) or rows on their way to the spool (release them
        with ``done_spilling``)."""
        with self.lock:
            rows: list[Sample] = []
            popleft = self._buffer.popleft
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

    def put_back(self, rows: list[Sample]) -> None:
        """Rows taken that neither the server nor the disk took: back at the buffer's head."""
        with self.lock:
            self._buffer.extendleft(reversed(rows))

    def done_inflight(self) -> None:
        with self.lock:
            self.inflight, self.inflight_spooled = None, False

    def done_spilling(self, count: int) -> None:
        with self.lock:
            self.spilling -= count

    def inflight_was_spooled(self) -> bool:
        """Whether the guard spooled the batch in the request (then the spool's replay, not
        this request, counts it as sent; a failed request need not spool it again). Waits
        for a copy the guard is writing, so the answer is what the disk will hold."""
        with self._copying, self.lock:
            return self.inflight_spooled

    def answered_inflight(self) -> bool:
        """The request in flight was answered: ``inflight_was_spooled``, and from now on the
        guard copies nothing of it (a copy made after the answer was counted would be
        counted again when the spool is replayed)."""
        with self._copying, self.lock:
            spooled = self.inflight_spooled
            self.inflight, self.inflight_spooled = None, False
            return spooled

    # -- the sender's side: events --------------------------------------------------------------
    def take_events(self, limit: int) -> list[Any]:
        """Up to ``limit`` queued events, oldest first, as JSON: the next events request
        (release it with ``end_events``)."""
        with self.lock:
            events = self._events
            batch = [json_safe(events.popleft()) for _ in range(min(len(events), limit))]
            self.inflight_events, self.inflight_events_spooled = batch, False
            return batch

    def end_events(self, batch: list[Any], delivered: bool) -> bool:
        """The events request is over. Not ``delivered``, the batch goes back to the queue's
        head unless the guard spooled it meanwhile; True if it did."""
        with self._copying, self.lock:
            spooled = self.inflight_events_spooled
            self.inflight_events, self.inflight_events_spooled = None, False
            if not delivered and not spooled:
                self._events.extendleft(reversed(batch))
            return spooled

    # -- overflow: a burst faster than the sender -----------------------------------------------
    def make_room(self) -> bool:
        """On the training thread, when the memory buffer is full: move its older half to the
        spool (back-pressure: the caller waits for the disk). False if the spool cannot take
        it (then the caller counts the overflow as dropped)."""
        if not self.spool_usable():
            return False
        target = self._memory_max // 2
        while len(self._buffer) > target:
            rows = self.take(min(self._batch_max, len(self._buffer) - target), False)
            if not rows:
                break
            columns, left_out = rows_to_columns(rows, self.series_prefix)
            self.count_invalid(left_out)
            if columns["seq"] and not self.to_spool(columns, hold=True):
                self.put_back(rows)
                self.done_spilling(len(rows))
                return False
            self.done_spilling(len(rows))
        return True

    def spool_problem(self) -> str:
        """Why the spool cannot take samples now (for a message about dropped ones)."""
        if self.spool is None:
            return "there is no spool (see the warning at init)"
        return self._spool_trouble or "the spool could not take them"

    def spill(self, force: bool, keep: int = 0) -> None:
        """Move buffered rows to the spool, oldest first: all of them if ``force`` or
        ``batch_interval`` has passed since the last spill (so an outage keeps at most that
        much in memory), else whole batches only; ``keep`` newest rows stay (the sender's
        next requests). Without a usable spool the rows stay in memory, where ``commit``
        bounds them at ``memory_max`` (counting the overflow as dropped)."""
        if not self.spool_usable():
            return
        now = time.monotonic()
        if now - self._last_spill >= self.settings.batch_interval:
            force = True
        if self._buffer and force:
            self._last_spill = now
        batch_max = self._batch_max
        while len(self._buffer) > keep and (force or len(self._buffer) - keep >= batch_max):
            rows = self.take(min(batch_max, len(self._buffer) - keep), sending=False)
            columns, left_out = rows_to_columns(rows, self.series_prefix)
            self.count_invalid(left_out)
            if columns["seq"] and not self.to_spool(columns, hold=not left_out):
                self.put_back(rows)  # no disk: keep them in memory
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
            left = len(self._buffer)
            self._buffer.clear()
        if left:
            self.drop(left, "lost-at-exit", "they could not be sent or spooled at finish")
            self._report(f"{left} samples could not be sent or spooled", key="lost-at-exit")
        self.spill_events(final=True)

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
                f"(up to {self._memory_max}) while the server is unreachable",
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

    def count_invalid(self, left_out: list[str]) -> None:
        """Count the samples left out of a batch because the server would refuse them (each
        one's reason in ``left_out``), and say so once, with the first reason."""
        if left_out:
            why = f"the server refuses them (e.g. {left_out[0]})"
            self.drop(len(left_out), "invalid", why)
            self._report(
                f"{len(left_out)} samples left out, the server would refuse them: "
                f"{left_out[0]} (status().dropped counts them; the rest are sent)",
                key="invalid",
                level=logging.WARNING,
            )

    def spill_events(self, final: bool = False) -> None:
        """Events go to the spool too when the run ends offline or unreachable; ``final`` (at
        finish): what is left without a spool is lost, and counted."""
        if self.spool is None and final and self._events:
            with self.lock:
                left = len(self._events)
                self._events.clear()
            self.dropped_events += left
            self._report(
                f"{left} events could not be sent and there is no spool",
                key="events-lost-at-exit",
                level=logging.WARNING,
            )
            return
        if self.spool is None or not self._events:
            return
        batch: list[Any] = []
        with self.lock, contextlib.suppress(IndexError):
            while True:
                batch.append(json_safe(self._events.popleft()))
        for start in range(0, len(batch), EVENTS_PER_REQUEST):  # a record is one request
            chunk = batch[start : start + EVENTS_PER_REQUEST]
            try:
                ok = self.spool.append_record({"events": chunk})
            except OSError:
                ok = False
            if not ok:
                self.dropped_events += len(chunk)

    def spool_inflight(self) -> None:
        """A copy of the batch (and the events) in a hung request to the spool, once: a
        duplicate is harmless (the server ignores a (run, seq) it has). Under ``_copying``:
        the sender, answered meanwhile, waits for the copy before it decides who counts it."""
        with self._copying:
            self._spool_inflight()

    def _spool_inflight(self) -> None:
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
