"""The one owner of what is committed but not yet acknowledged, and of its way to the spool.

``Outbox`` holds the memory side of a run's delivery: the buffer of committed samples (the
Run hands it each finished step with ``commit``; the outbox numbers the samples and keeps
them), the events queued by ``Run.log_event``, the batch in the request being sent, and every
move of those to the on-disk spool (a spill during an outage, a copy of a hung request's
batch, the older half of a full buffer, what is left at exit).

A batch has one form from the moment it is taken: ``take`` converts the rows to the wire's
columns (``_records.rows_to_columns``, its one caller), leaving out and counting the rows the
server would refuse, and returns a ``Batch``. The sender posts its columns and tells the
outbox how the request ended (``end_batch``); a batch that neither the server nor the disk
took is held as it is, in memory, and is the next one taken. Samples reach the disk in one
place, ``_to_spool``; events in one place, ``_spool_events``.

Threads: ``commit`` runs on whichever thread commits a step, one at a time (the Run commits
under its own lock); it only appends at the buffer's tail, an atomic ``deque.append``, so the
training thread never waits for the outbox's lock in the common case. Every other move of
rows (take, hold, clear) is made under ``lock``, by the sender or the guard.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from noisescope._config import Settings
from noisescope._records import Columns, SampleRow, json_safe, new_sample, rows_to_columns
from noisescope._spool import RunSpool

logger = logging.getLogger("noisescope")

#: How the outbox reports a problem: (message, key of the one warning or None, log level).
Report = Callable[..., None]

#: Events held in memory at most; beyond it the older half goes to the spool (or, with no
#: usable spool, a new event is dropped and counted).
EVENTS_MAX = 10_000
#: Events per request, and per spool record (a record is replayed as one request).
EVENTS_PER_REQUEST = 1000


@dataclass(slots=True)
class Batch:
    """Samples taken from the buffer, in the form they keep until the server or the disk
    takes them: the wire's columns, without the rows the server would refuse."""

    columns: Columns
    #: Rows left out of ``columns`` because the server would refuse them (counted dropped).
    invalid: int
    #: Sent before in a request that got no answer (or a retryable one): the server may hold
    #: these samples already, so samples it held are re-sends, not another session's.
    sent_before: bool = False

    @property
    def count(self) -> int:
        """The samples in ``columns``."""
        return len(self.columns["seq"])


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
        first_index: int = 0,
    ) -> None:
        self.settings = settings
        self.spool = spool
        self.series_prefix = series_prefix
        self._report = report
        self._wake = wake
        self._memory_max = settings.memory_max
        self._batch_max = settings.batch_max
        self._buffer: deque[SampleRow] = deque()
        #: Batches taken that neither the server nor the disk took, oldest first: taken again
        #: before the buffer (they count against ``memory_max`` as the buffer's rows do).
        self._held: deque[Batch] = deque()
        self._held_rows = 0
        #: Rows the buffer may hold before ``commit`` makes room: ``memory_max`` less the
        #: held batches' (one attribute for the training thread to read).
        self._room = self._memory_max
        self.lock = threading.Lock()
        # seq = local index · stride + offset: unique across ranks when all ranks send; the
        # index begins at first_index (a resumed session's, ``_resume``), else at 0.
        self._seq_stride = settings.world_size if settings.all_ranks else 1
        self._seq = first_index * self._seq_stride + (settings.rank if settings.all_ranks else 0)
        #: The batch in the request being sent, and whether the guard already spooled a copy.
        self.inflight: Batch | None = None
        self.inflight_spooled = False
        #: Events in the request being sent (a copy may be spooled by the guard likewise).
        self.inflight_events: list[Any] | None = None
        self.inflight_events_spooled = False
        #: Held while the guard copies the request in flight to the spool, and while the
        #: sender ends a request (who spools its batch is decided once).
        self._copying = threading.Lock()
        #: Set (under ``_copying``) when close() gave up waiting: a request ending after that
        #: holds nothing in memory, which is being emptied for good.
        self._abandoned = False
        #: Samples taken on their way to the spool (counted as queued meanwhile).
        self.spilling = 0
        #: Rows taken from the buffer and being converted to a batch (queued meanwhile).
        self.converting = 0
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
        """Number a finished step's records (a ``SampleRow``'s fields after ``seq``) and keep
        them. A full memory first moves its older half to the spool (the caller waits for the
        disk); a record neither can take is counted and said once. Wakes the sender when a
        batch is ready."""
        rows = self._buffer
        before = len(rows)
        seq = self._seq
        stride = self._seq_stride
        for record in records:
            if len(rows) >= self._room and not self._make_room():
                self.overflow += 1
                continue
            rows.append(new_sample((seq, *record)))
            seq += stride
        self._seq = seq
        if before < self._batch_max <= len(rows):
            self._wake()

    def __len__(self) -> int:
        """Samples waiting in memory: the buffer and the held batches (not counting a batch in
        a request or on its way to disk)."""
        return len(self._buffer) + self._held_rows

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
            if not self._spool_events(batch):
                with self.lock:
                    self._events.extendleft(reversed(batch))
                return len(self._events) < EVENTS_MAX
        return True

    def _make_room(self) -> bool:
        """On the training thread, when memory is full: ``_spill_half``, or say once that
        it cannot (then the caller counts the overflow as dropped)."""
        if self._spill_half():
            return True
        if self.overflow == 0:
            logger.warning(
                "noisescope: the memory buffer is full (memory_max=%d) and %s: dropping "
                "samples (counted in status().dropped)",
                self._memory_max,
                self.spool_problem(),
            )
        return False

    def _spill_half(self) -> bool:
        """Move the older half of what waits in memory to the spool (back-pressure: the
        committing thread waits for the disk). False if the spool cannot take it."""
        if not self.spool_usable():
            return False
        target = self._memory_max // 2
        while len(self) > target:
            batch = self._take(min(self._batch_max, len(self) - target), sending=False)
            if batch is None:
                break
            if not self._spill_batch(batch, hold=True):
                return False
        return True

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
        """Samples in memory: the buffer, held batches, rows being converted, the batch in a
        request (unless spooled), those on their way to disk."""
        with self.lock:
            inflight = self.inflight if not self.inflight_spooled else None
            sending = inflight.count if inflight is not None else 0
            waiting = len(self._buffer) + self._held_rows + self.converting
            return waiting + sending + self.spilling

    def in_memory(self) -> bool:
        """Whether any sample or event in a request is held only in memory."""
        return bool(
            self._buffer
            or self._held
            or self.inflight is not None
            or self.converting
            or self.spilling
            or self.inflight_events
        )

    def has_events(self) -> bool:
        return bool(self._events)

    def progress(self) -> tuple[int, int]:
        """(samples out of memory so far, samples committed so far): a held batch is in
        memory again."""
        with self.lock:
            return self.taken - self._held_rows, self.taken + len(self._buffer)

    # -- the sender's side: batches -------------------------------------------------------------
    def take(self, limit: int) -> Batch | None:
        """The batch of the next request: a held batch, else up to ``limit`` rows of the
        buffer, oldest first, in columns (None: nothing to take). End its request with
        ``end_batch``."""
        return self._take(limit, sending=True)

    def _take(self, limit: int, sending: bool) -> Batch | None:
        """The oldest held batch, else up to ``limit`` rows of the buffer converted to a batch
        (the rows the server would refuse left out, and counted; converted outside ``lock``):
        the request's batch (``sending``) or one on its way to the spool (``_spill_batch``)."""
        with self.lock:
            if self._held:
                batch = self._held.popleft()
                self._count_held(-batch.count)
                self._taken(batch, sending)
                return batch
            rows: list[SampleRow] = []
            popleft = self._buffer.popleft
            try:
                for _ in range(limit):
                    rows.append(popleft())
            except IndexError:
                pass
            if not rows:
                return None
            self.taken += len(rows)
            self.converting += len(rows)
        converted: Batch | None = None
        try:
            columns, left_out = rows_to_columns(rows, self.series_prefix)
            converted = Batch(columns, len(left_out))
        finally:
            with self.lock:
                self.converting -= len(rows)
                if converted is not None:
                    self._taken(converted, sending)
        self._count_invalid(left_out)
        return converted

    def _taken(self, batch: Batch, sending: bool) -> None:
        """``batch`` is the request's or on its way to the spool (caller holds ``lock``)."""
        if sending:
            self.inflight, self.inflight_spooled = batch, False
        else:
            self.spilling += batch.count

    def _hold(self, batch: Batch) -> None:
        """Keep a batch neither the server nor the disk took, in memory, in seq order (caller
        holds ``lock``): it is the next one taken."""
        held = self._held
        first = batch.columns["seq"][0]
        index = 0
        while index < len(held) and held[index].columns["seq"][0] < first:
            index += 1
        held.insert(index, batch)
        self._count_held(batch.count)

    def _count_held(self, rows: int) -> None:
        """``rows`` more (or fewer) held rows (caller holds ``lock``)."""
        self._held_rows += rows
        self._room = self._memory_max - self._held_rows

    def end_batch(self, batch: Batch, delivered: bool) -> None:
        """The request of ``batch`` (from ``take``) is over. Not ``delivered`` (no answer, or
        one to retry), the batch goes to the spool unless the guard copied it there while the
        request hung; one the disk cannot take is held in memory, unless close() gave up
        waiting meanwhile (``spill_everything``): then it is counted dropped. (Its rows the
        server would refuse were left out, and counted, when it was taken.)"""
        with self._copying:
            hold = False
            if not delivered and batch.count:
                with self.lock:
                    spooled = self.inflight_spooled
                if not spooled:
                    hold = not self._to_spool(batch.columns, hold=not self._abandoned)
            with self.lock:
                self.inflight, self.inflight_spooled = None, False
                if hold:
                    batch.sent_before = True
                    self._hold(batch)

    def inflight_was_spooled(self) -> bool:
        """Whether the guard spooled the batch in the request (then the spool's replay, not
        this request, counts it as sent; a failed request need not spool it again). Waits
        for a copy the guard is writing, so the answer is what the disk will hold."""
        with self._copying, self.lock:
            return self.inflight_spooled

    def events_were_spooled(self) -> bool:
        """Whether the guard spooled the events in the request (as ``inflight_was_spooled``)."""
        with self._copying, self.lock:
            return self.inflight_events_spooled

    def drop_everything(self, kind: str, why: str) -> tuple[int, int]:
        """Count every sample and event in memory as dropped (``kind``, ``why``) and let them
        go: the run will take nothing more (deleted on the server). Returns (samples, events);
        the batch in a request ends with its answer."""
        with self.lock:
            samples = len(self._buffer) + self._held_rows
            events = len(self._events)
            self._buffer.clear()
            self._held.clear()
            self._count_held(-self._held_rows)
            self._events.clear()
        self.drop(samples, kind, why)
        self.dropped_events += events
        return samples, events

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

    # -- to the spool ---------------------------------------------------------------------------
    def spool_problem(self) -> str:
        """Why the spool cannot take samples now (for a message about dropped ones)."""
        if self.spool is None:
            return "there is no spool (see the warning at init)"
        return self._spool_trouble or "the spool could not take them"

    def spill(self, force: bool, keep: int = 0) -> None:
        """Move samples waiting in memory to the spool, oldest first: all of them if ``force``
        or ``batch_interval`` has passed since the last spill (so an outage keeps at most that
        much in memory), else whole batches only; ``keep`` newest rows stay (the sender's
        next requests). Without a usable spool they stay in memory, where ``commit`` bounds
        them at ``memory_max`` (counting the overflow as dropped)."""
        if not self.spool_usable():
            return
        now = time.monotonic()
        if now - self._last_spill >= self.settings.batch_interval:
            force = True
        if len(self) and force:
            self._last_spill = now
        batch_max = self._batch_max
        while len(self) > keep and (force or len(self) - keep >= batch_max):
            batch = self._take(min(batch_max, len(self) - keep), sending=False)
            if batch is None or not self._spill_batch(batch, hold=True):
                return  # no disk: kept in memory

    def _spill_batch(self, batch: Batch, hold: bool) -> bool:
        """A batch ``_take`` took for the spool, to the spool; False if the disk could not
        take it and, with ``hold``, it is held in memory again."""
        kept = bool(batch.count) and not self._to_spool(batch.columns, hold=hold)
        with self.lock:
            self.spilling -= batch.count
            if kept:
                self._hold(batch)
        return not kept

    def spool_usable(self) -> bool:
        return self.spool is not None and time.monotonic() >= self._spool_retry_at

    def spill_everything(self) -> None:
        """Called on the caller's thread at close when the wait ran out."""
        with self._copying:  # a request ending from now on spools its batch or counts it
            self._abandoned = True
        self._spool_retry_at = 0.0  # last chance: try the disk
        # The batch being sent right now: a copy (the server ignores a duplicate), counted as
        # spooled only, as a hung request's is.
        self.spool_inflight()
        self.spill(force=True)
        with self.lock:  # what neither the server nor the disk took is lost: count it
            left = len(self._buffer) + self._held_rows
            self._buffer.clear()
            self._held.clear()
            self._count_held(-self._held_rows)
        if left:
            self.drop(left, "lost-at-exit", "they could not be sent or spooled at finish")
            self._report(f"{left} samples could not be sent or spooled", key="lost-at-exit")
        self.spill_events(final=True)

    def _to_spool(self, columns: Columns, hold: bool) -> bool:
        """Append a batch to the spool: the one place samples go to disk. With ``hold``, a
        batch the disk cannot take (no spool, I/O error) is not counted dropped: False tells
        the caller to keep it in memory."""
        count = len(columns["seq"])
        if self.spool is None or not self.spool_usable():
            if hold:
                return False
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
            self.drop(count, "spool", self._spool_trouble)
            return True
        if not ok:
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

    def _count_invalid(self, left_out: list[str]) -> None:
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

    def _spool_events(self, events: list[Any]) -> bool:
        """Append one record of events to the spool: the one place events go to disk. False
        if it could not (no spool, the limit, an I/O error)."""
        try:
            return self.spool is not None and self.spool.append_record({"events": events})
        except OSError:
            return False

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
        with self.lock:
            while self._events:
                batch.append(json_safe(self._events.popleft()))
        for start in range(0, len(batch), EVENTS_PER_REQUEST):  # a record is one request
            chunk = batch[start : start + EVENTS_PER_REQUEST]
            if not self._spool_events(chunk):
                self.dropped_events += len(chunk)

    def spool_inflight(self) -> None:
        """A copy of the batch (and the events) in a hung request to the spool, once: a
        duplicate is harmless (the server ignores a (run, seq) it has). Under ``_copying``:
        the sender, answered meanwhile, waits for the copy before it decides who counts it."""
        with self._copying:
            self._spool_inflight()

    def _spool_inflight(self) -> None:
        with self.lock:
            batch = self.inflight if not self.inflight_spooled else None
            self.inflight_spooled = self.inflight_spooled or batch is not None
            events = self.inflight_events if not self.inflight_events_spooled else None
            self.inflight_events_spooled = self.inflight_events_spooled or events is not None
        if batch is not None and batch.count and not self._to_spool(batch.columns, hold=True):
            with self.lock:
                self.inflight_spooled = False  # not on disk after all
        if events and not self._spool_events(events):
            with self.lock:
                self.inflight_events_spooled = False
