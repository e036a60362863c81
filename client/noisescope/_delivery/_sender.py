"""The background sender: batches committed samples, POSTs them, retries, spools.

One daemon thread per run. The training thread only hands finished steps to the ``Outbox``;
this thread takes them in batches (by count: ``batch_max``; by time: ``batch_interval``),
each already in the wire's columns (``Outbox.take``), and POSTs them through a ``Transport``
(``_request`` builds the bodies); a request that fails hands its batch back to the outbox
(``Outbox.end_batch``), which spools it or holds it. The sender only decides when a batch goes;
what an answer means is its base's, ``Exchange`` (``_exchange``, with the failure policy). What
it does next depends on one ``State`` only, changed by ``_state.transition`` in ``_on``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from noisescope._delivery._exchange import _DELETED_WHY, Exchange
from noisescope._delivery._guard import Guard
from noisescope._delivery._outbox import EVENTS_PER_REQUEST
from noisescope._delivery._state import Signal, Stage
from noisescope._retry import Outcome
from noisescope._spool import batch_size, replay_requests
from noisescope._sync import deliver_orphans

#: Seconds ``close`` waits before it says that it is waiting for the server.
SLOW_CLOSE = 1.0

logger = logging.getLogger("noisescope")


def _delivered(outcome: Outcome | None) -> bool:
    """Whether a request is over for good: answered, and not to be sent again (a refusal
    counts what it refused)."""
    return outcome is not None and outcome not in ("retry", "missing", "refused")


class Sender(Exchange):
    """Sends its ``outbox``'s batches to the server on its own thread (what fails goes back to
    the outbox, which spools it). ``transport`` None: offline, everything goes to the spool."""

    #: The sending thread and the spool's guard, once ``start`` made them (``Exchange``'s
    #: constructor is Sender's: what it builds is all a sender needs before it starts).
    _thread: threading.Thread | None = None
    _guard: Guard | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name="noisescope-sender", daemon=True)
        self._thread.start()
        if self.spool is not None and self.transport is not None:
            self._guard = Guard(
                self.outbox,
                self.settings,
                lambda: self._request_started,
                lambda: self.state.spools_only or self.state.gone,
            )
            self._guard.start()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def queued(self) -> int:
        return self.outbox.queued()

    def idle(self) -> bool:
        """Nothing in memory and nothing spooled that could still be sent in this process."""
        if self.outbox.in_memory():
            return False
        if self.state.spools_only or self.state.gone:
            return True
        if self.outbox.has_events():
            return False
        return not (self.spool is not None and self.spool.bytes_used > 0)

    def flush(self, timeout: float) -> bool:
        """Ask for everything to be sent now; wait up to ``timeout``. True if all was sent."""
        self._on(Signal.FLUSH)
        self._wake.set()
        deadline = time.monotonic() + max(0.0, timeout)
        with self._cond:
            while not self.idle():
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self.alive:
                    break
                self._cond.wait(min(remaining, 0.05))
                self._wake.set()
        self._on(Signal.FLUSHED)
        return self.idle()

    def close(
        self,
        final: dict[str, Any] | None,
        timeout: float,
        waiting: Callable[[], None] | None = None,
    ) -> bool:
        """Flush for at most ``timeout``; spool what is left; stop the thread. ``waiting`` is
        called once if the server has not taken everything after ``SLOW_CLOSE`` seconds.
        Returns True if Ctrl-C cut the wait short (what was left is spooled all the same)."""
        if self.spool is not None and final is not None:
            try:  # before any wait: what sync needs should the process die meanwhile
                self.spool.write_end(final)
            except OSError as exc:
                self.end_unrecorded = str(exc)
        self._on(Signal.CLOSE, final=final)
        self._wake.set()
        interrupted = False
        outbox = self.outbox
        if self._thread is not None:
            try:
                self._thread.join(min(SLOW_CLOSE, max(0.0, timeout)))
                if self._thread.is_alive() and timeout > SLOW_CLOSE and waiting is not None:
                    waiting()
                    self._thread.join(timeout - SLOW_CLOSE)
            except KeyboardInterrupt:
                interrupted = True
        if self._thread is not None and self._thread.is_alive():
            self.abandon()  # the server did not take everything in time
        elif self.state.gone:
            self._drop_deleted()
        elif len(outbox) or outbox.has_events():  # thread died or never started
            outbox.spill_everything()
            outbox.spill_events(final=True)
        if self._guard is not None:
            self._guard.stop()
        if self.transport is not None and not self.alive:
            with contextlib.suppress(Exception):
                self.transport.close()
        return interrupted

    def abandon(self) -> None:
        """Stop waiting for the server: what it has not taken goes to the spool now, and what
        the spool cannot take is counted dropped (a deleted run's is, all of it). ``close``
        calls it when its wait runs out; a signal that ends the process during ``finish()``
        does too (``_process``)."""
        outbox = self.outbox
        self._on(Signal.ABANDON)
        self._wake.set()
        self._leave_on_disk()
        if self._thread is not None:
            self._thread.join(0.2)
        if not self.alive:
            # What reached memory during the spill (a step another thread committed): spool it
            # or count it too. A request ending after the spill counts its own batch.
            self._leave_on_disk()
        outbox.spill_events(final=True)
        if self._guard is not None:
            self._guard.stop()

    def _leave_on_disk(self) -> None:
        """Everything in memory to the spool (``Outbox.spill_everything``); of a deleted run,
        counted dropped instead."""
        if self.state.gone:
            self._drop_deleted()
        else:
            self.outbox.spill_everything()

    def _drop_deleted(self) -> None:
        """The run was deleted on the server: what is in memory and in the spool will never
        be taken; count it dropped and let it go (the spool's segments are deleted)."""
        self.outbox.drop_everything("run-deleted", _DELETED_WHY)
        if self.spool is not None:
            samples, events = self.spool.drop_segments()
            self.outbox.drop(samples, "run-deleted", _DELETED_WHY)
            self.outbox.dropped_events += events

    # -- the thread ---------------------------------------------------------------------------
    def _main(self) -> None:
        while True:
            self._wake.wait(self._wait_time())
            self._wake.clear()
            try:
                done = self._tick()
            except Exception as exc:  # the sender must never die
                self._error(f"internal error: {type(exc).__name__}: {exc}", key="internal")
                logger.debug("noisescope sender error", exc_info=True)
                done = self.state.stopping
                time.sleep(0.05)
            with self._cond:
                self._cond.notify_all()
            if done or self.state.stage is Stage.ABANDONED:
                if self._guard is not None:
                    self._guard.stop()
                return

    def _wait_time(self) -> float:
        state = self.state
        interval = 0.02 if state.urgent else self.settings.batch_interval
        now = time.monotonic()
        if state.retry_at > now:
            return max(0.0, min(state.retry_at - now, interval))
        return interval

    def _tick(self) -> bool:
        """One pass; returns True when the thread may exit."""
        # One snapshot: close() may end the RUNNING stage mid-pass, and exiting on a later read
        # without having sent the final status would lose it.
        state = self.state
        outbox = self.outbox
        if self._commit_open is not None and state.urgent:
            self._commit_open()
        if state.gone:
            self._drop_deleted()
            return state.stopping
        if state.spools_only:
            outbox.spill(force=True)
            outbox.spill_events()
            return state.stopping
        if time.monotonic() < state.retry_at:
            # Keep retrying until close() gives up (its bounded wait); meanwhile stay on disk,
            # events too (replayed with the samples when the server is back).
            outbox.spill(force=state.urgent)
            outbox.spill_events()
            return False
        if not self._ensure_run():
            return False
        if not self._replay_spool():
            return False
        if not self._send_buffer():
            return False
        if outbox.has_events() and not self._send_events():
            return False
        if state.final is not None and not self.final_sent and self.idle():
            self._send_final(state.final)
        if (
            not state.stopping
            and self._heartbeats
            and time.monotonic() - self._last_contact >= self.settings.heartbeat_interval
            and self.idle()
        ):
            self._heartbeat()
        if not state.orphans_done and not state.stopping and self.idle():
            self._on(Signal.ORPHANS_DONE)
            self._resume_orphans()
        return state.stopping and self.idle()

    def _resume_orphans(self) -> None:
        """Deliver spools that earlier online runs to this server left behind
        (``_sync.deliver_orphans``), once, when this run's own data is all sent."""
        if self.spool is None or self.transport is None or not self.settings.resume_orphans:
            return
        problem = deliver_orphans(
            self.spool,
            self.settings.url,
            self.transport,
            compress=self._compress,
            stop=lambda: self.state.stopping,
        )
        if problem is not None:
            self._error(problem, key="orphans", level=logging.WARNING)

    # -- sending ------------------------------------------------------------------------------
    def _replay_spool(self) -> bool:
        """Send spooled batches, oldest first; a segment is deleted once all of it is taken.

        Consecutive spooled batches are merged into requests of up to ``replay_max`` samples:
        after an outage the backlog drains in a few large requests, not many small ones. A
        merge refused whole is sent again record by record (``_replay_alone``): one refused
        record costs only its own samples.
        """
        if self.spool is None or self.spool.bytes_used <= 0:
            return True
        for path in self.spool.seal():
            done = self.spool.replay_start(path)
            known = len(self.spool.set_aside)
            records = self.spool.read(path)
            for aside in self.spool.set_aside[known:]:  # damaged records: named, and counted
                why = f"their spool records were damaged ({aside.sentence()})"
                self.outbox.drop(aside.samples, "damaged-spool", why)
                self.outbox.dropped_events += aside.events
            first = done
            for last, kind, payload in replay_requests(records, done, self.replay_max):
                if kind == "events":
                    outcome = self._post_events(payload["events"], replay=True)
                else:
                    outcome = self._post(payload["columns"], alone=last == first, replay=True)
                    if outcome == "fatal" and last > first:
                        outcome = self._replay_alone(path, records, first, last)
                        if outcome == "gone" or not _delivered(outcome):
                            return False
                        first = last + 1
                        continue
                if outcome == "gone" or not _delivered(outcome):
                    return False  # a deleted run's spool is counted when it is dropped
                samples = len(payload["columns"]["seq"]) if kind == "samples" else 0
                self.spool.acknowledge(path, last + 1, samples)
                first = last + 1
            self.spool.discard(path)
        return True

    def _replay_alone(
        self, path: Path, records: list[dict[str, Any]], first: int, last: int
    ) -> Outcome | None:
        """Send records[first:last + 1] of a spool segment one request each (their merge was
        refused whole), each acknowledged once answered; the first outcome that is not a
        delivery, else "ok"."""
        assert self.spool is not None
        for index in range(first, last + 1):
            size = batch_size(records[index])
            if size:
                outcome = self._post(records[index]["columns"], replay=True)
                if outcome == "gone" or not _delivered(outcome):
                    return outcome
            self.spool.acknowledge(path, index + 1, size)
        return "ok"

    def _send_buffer(self) -> bool:
        """Send the outbox's batches while one is due; False when a request failed (its
        batch is then on disk, or held in memory by the outbox and sent first next time)."""
        outbox = self.outbox
        batch_max = self.settings.batch_max
        while len(outbox):
            due = (
                len(outbox) >= batch_max
                or self.state.urgent
                or time.monotonic() - self._last_send >= self.settings.batch_interval
            )
            if not due:
                return True
            batch = outbox.take(batch_max)
            if batch is None:
                break
            outcome: Outcome | None = None
            try:
                # a batch held after a request with no answer may be stored already
                outcome = (
                    self._post(batch.columns, fresh=not batch.sent_before) if batch.count else "ok"
                )
            finally:
                # spooled, or held in memory if the disk cannot take it (Outbox.end_batch)
                outbox.end_batch(batch, _delivered(outcome))
            if outcome == "gone":
                return False  # the next pass counts what is left
            if not _delivered(outcome):
                outbox.spill(force=False)
                return False
            half = self.settings.memory_max // 2
            if len(outbox) > half:
                # Producing faster than the server takes: what is beyond half of memory_max
                # goes to the disk, oldest first, before the training thread meets the bound
                # (``Outbox.commit``); a spill costs more than a send, so no more than that.
                outbox.spill(force=True, keep=half)
        self._last_send = time.monotonic()
        return True

    def _send_events(self) -> bool:
        """POST queued events (``{"events": [...]}``); keep them on no or a retryable answer."""
        outbox = self.outbox
        while outbox.has_events():
            batch = outbox.take_events(EVENTS_PER_REQUEST)
            outcome: Outcome | None = None
            try:
                outcome = self._post_events(batch)
            finally:
                delivered = _delivered(outcome)
                outbox.end_events(batch, delivered)
            if not delivered or outcome == "gone":
                return False
        return True
