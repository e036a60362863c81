"""The background sender: batches committed samples, POSTs them, retries, spools.

One daemon thread per run. The training thread only hands finished steps to the ``Outbox``;
this thread takes them in batches (by count: ``batch_max``; by time: ``batch_interval``),
each already in the wire's columns (``Outbox.take``), and POSTs them through a ``Transport``
(``_request`` builds the bodies); a request that fails hands its batch back to the outbox
(``Outbox.end_batch``), which spools it or holds it. The sender only decides when a batch goes
and what an answer means. What it does next depends on one ``State`` only, changed by
``_state.transition`` in ``_on``.

Failure policy (why it is safe):
- connection errors, timeouts, 408, 429 and 5xx are *retryable* (``_retry``): the batch goes to
  the on-disk spool at once (durable), the sender backs off exponentially with jitter (honouring
  ``Retry-After``) and, while the outage lasts, spills new batches to the spool instead of
  holding them in memory. When a retry succeeds the spool is replayed, oldest first. A request
  that hangs is covered by the ``Guard``.
- other 4xx are the client's fault: logged once with the server's message, never retried; the
  batch is counted as dropped. A refused run creation (401/403: a token problem; or an answer
  no noisescope server gives) switches the run to spooling, so ``noisescope sync --token`` can
  deliver it later.
- every sample carries (run id, seq); the server inserts-or-ignores, so a replay or a retry of a
  batch whose answer was lost never double-counts.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from noisescope import _wire
from noisescope._config import DEFAULT_URL, Settings
from noisescope._delivery._guard import Guard
from noisescope._delivery._outbox import EVENTS_PER_REQUEST, Outbox
from noisescope._delivery._state import Link, Signal, Stage, State, initial, transition
from noisescope._records import select_rows
from noisescope._redact import redact_text, redact_url
from noisescope._request import build_request, is_loopback
from noisescope._retry import (
    Backoff,
    Outcome,
    answer_field,
    classify,
    inserted,
    not_noisescope,
    not_noisescope_problem,
    parse_retry_after,
    refused_rows,
)
from noisescope._spool import Columns, RunSpool, replay_requests
from noisescope._sync import deliver_orphans
from noisescope._transport import HTTPTransport, Response, Transport, TransportError

logger = logging.getLogger("noisescope")

#: Seconds ``close`` waits before it says that it is waiting for the server.
SLOW_CLOSE = 1.0


def _delivered(outcome: Outcome | None) -> bool:
    """Whether a request is over for good: answered, and not to be sent again (a refusal
    counts what it refused)."""
    return outcome is not None and outcome not in ("retry", "missing", "refused")


class Sender:
    """Sends its ``outbox``'s batches to the server on its own thread (what fails goes back to
    the outbox, which spools it). ``transport`` None: offline, everything goes to the spool."""

    def __init__(
        self,
        settings: Settings,
        run_id: str,
        run_body: _wire.RunBody,
        transport: Transport | None,
        spool: RunSpool | None,
        commit_open: Callable[[], None] | None = None,
        *,
        on_page: Callable[[Any], None] | None = None,
    ) -> None:
        self.settings = settings
        self.run_id = run_id
        self.run_body = run_body
        self.transport = transport
        self.spool = spool
        self._commit_open = commit_open
        #: Told the run's dashboard link from the server's answers to the run's creation.
        self._on_page = on_page
        self.series_prefix = f"rank{settings.rank}" if settings.all_ranks else ""
        #: Samples per request when replaying the spool.
        self.replay_max = min(max(settings.batch_max, 5000), _wire.MAX_SAMPLES_PER_REQUEST)
        self.backoff = Backoff(settings.backoff_base, settings.backoff_max)
        self._wake = threading.Event()
        self._cond = threading.Condition()
        #: The one owner of what is committed and not yet acknowledged.
        self.outbox = Outbox(settings, spool, self.series_prefix, self._error, self._wake.set)
        #: What the thread does next depends on this only; changed by ``_on`` alone.
        self.state: State = initial(has_server=transport is not None)
        self._state_lock = threading.Lock()
        #: When the request now on the wire began (None between requests).
        self._request_started: float | None = None
        self._thread: threading.Thread | None = None
        self._guard: Guard | None = None
        #: Why the server will not take this run (its answer to PUT), when ``Link.REFUSED``.
        self.refusal: str | None = None
        #: gzip large bodies, except to a server on this machine (CPU for nothing there).
        self._compress = not is_loopback(settings.url)
        self._last_send = time.monotonic()
        #: Last HTTP answer of any kind (the heartbeat is due after heartbeat_interval without).
        self._last_contact = time.monotonic()
        self._heartbeats = True
        #: The HTTP status of a refused run creation (401/403: a token problem), if any.
        self.refused_status: int | None = None
        #: Whether that refusal was no noisescope server's answer (the dashboard's port?).
        self.not_noisescope = False
        #: What the outage now under way failed with (cleared from ``last_error`` once the
        #: server answers again: a recovered outage is no error of the run).
        self._outage_error: str | None = None
        #: Why the run's end could not be recorded in the spool at close, if it could not.
        self.end_unrecorded: str | None = None
        self._warned: set[str] = set()
        #: Samples of guard-copied batches counted as already stored (another session's),
        #: not to be counted sent when the copy is replayed.
        self._copies_already_stored = 0
        # counters
        self.sent = 0
        self.inserted = 0
        self.last_error: str | None = None
        self.requests = 0

    def _on(
        self, signal: Signal, *, retry_at: float = 0.0, final: Mapping[str, Any] | None = None
    ) -> State:
        """Apply ``signal``: the one place the sender's state changes."""
        with self._state_lock:
            self.state = transition(self.state, signal, retry_at=retry_at, final=final)
            return self.state

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name="noisescope-sender", daemon=True)
        self._thread.start()
        if self.spool is not None and self.transport is not None:
            self._guard = Guard(
                self.outbox,
                self.settings,
                lambda: self._request_started,
                lambda: self.state.spools_only,
            )
            self._guard.start()

    @property
    def dropped_events(self) -> int:
        return self.outbox.dropped_events

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def queued(self) -> int:
        return self.outbox.queued()

    def idle(self) -> bool:
        """Nothing in memory and nothing spooled that could still be sent in this process."""
        if self.outbox.in_memory():
            return False
        if self.state.spools_only:
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
            # The server did not take everything in time: leave the rest on disk.
            self._on(Signal.ABANDON)
            self._wake.set()
            outbox.spill_everything()
            self._thread.join(0.2)
            if not self._thread.is_alive():
                # What reached memory during the spill (a step another thread committed): spool
                # it or count it too. A request ending after the spill counts its own batch.
                outbox.spill_everything()
            outbox.spill_events(final=True)
        elif len(outbox) or outbox.has_events():  # thread died or never started
            outbox.spill_everything()
            outbox.spill_events(final=True)
        if self._guard is not None:
            self._guard.stop()
        if self.transport is not None and not self.alive:
            with contextlib.suppress(Exception):
                self.transport.close()
        return interrupted

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
    def _request(
        self, method: str, path: str, payload: Mapping[str, Any] | None
    ) -> Response | None:
        """One request (``payload`` None: an empty body); None (and the outage begins) if there
        was no HTTP answer."""
        assert self.transport is not None
        request = build_request(
            method,
            path,
            dict(payload) if payload is not None else None,
            compress=self._compress,
            gzip_min_bytes=self.settings.gzip_min_bytes,
        )
        self.requests += 1
        self._request_started = time.monotonic()
        try:
            return self.transport.handle_request(request)
        except TransportError as exc:
            self._enter_outage(str(exc), None)
            return None
        except Exception as exc:  # a broken transport is treated like an unreachable server
            self._enter_outage(f"transport error: {type(exc).__name__}: {exc}", None)
            return None
        finally:
            self._request_started = None

    def _enter_outage(
        self, reason: str, retry_after: float | None, warn: bool = True, lost: bool = False
    ) -> None:
        """No request before the backoff's delay (``lost``: the server lost the run, which is
        created again then)."""
        delay = self.backoff.next_delay(retry_after)
        self._on(Signal.LOST if lost else Signal.FAILED, retry_at=time.monotonic() + delay)
        self._error(reason, key=None)
        self._outage_error = reason
        logger.debug("noisescope: %s; retrying in %.2fs", reason, delay)
        if warn and "outage" not in self._warned:  # once, at the first failure, in the log
            self._warned.add("outage")
            where = (
                f"samples wait in the spool at {self.spool.dir}"
                if self.spool is not None
                else "samples wait in memory (there is no spool)"
            )
            logger.warning(
                "noisescope: cannot deliver to %s (%s); retrying in the background, %s and "
                "are sent when it answers (or with `noisescope sync`)",
                self._destination(),
                redact_text(reason),
                where,
            )

    def _destination(self) -> str:
        """Where requests go, for a message: the server's URL, or the transport given to
        ``init(transport=...)`` (with the URL it stands for, where one was set)."""
        url = redact_url(self.settings.url)
        if self.transport is None or isinstance(self.transport, HTTPTransport):
            return url
        through = f"the transport {type(self.transport).__name__}"
        # a URL set beside the transport names what it stands for; the default one, nothing
        return through if self.settings.url == DEFAULT_URL else f"{url} through {through}"

    def _answered(self, response: Response) -> Outcome:
        self._last_contact = time.monotonic()
        outcome = classify(response)
        if outcome == "retry":
            retry_after = parse_retry_after(response.header("Retry-After"))
            self._enter_outage(f"HTTP {response.status}: {response.detail()}", retry_after)
        elif outcome == "ok":
            self.backoff.reset()
            self._on(Signal.ANSWERED)
            if self._outage_error is not None and self.last_error == self._outage_error:
                self.last_error = None
            self._outage_error = None
        elif response.status in (401, 403) and self.state.link is Link.CREATED:
            self._refuse(response, "no longer takes run")
            return "refused"
        return outcome

    def _ensure_run(self) -> bool:
        if self.state.link is Link.CREATED:
            return True
        response = self._request("PUT", _wire.runs_path(self.run_id), self.run_body)
        if response is None:
            return False
        outcome = "fatal" if not_noisescope(response) else self._answered(response)
        if outcome == "ok":
            self._tell_page(response)
            self._say_server_warnings(response)
            self._on(Signal.CREATED)
            return True
        if outcome == "retry":
            return False
        self.not_noisescope = not_noisescope(response)
        self._refuse(response, "refused run")
        return False

    def _refuse(self, response: Response, what: str) -> None:
        """The server will not take this run (its creation, or a write once a token was
        revoked): from now on everything goes to the spool, for ``noisescope sync``."""
        self.refused_status = response.status
        if self.not_noisescope:
            request = f"PUT {_wire.runs_path(self.run_id)}"
            message = not_noisescope_problem(self.settings.url, request, response)
        else:
            message = f"server {what} {self.run_id} (HTTP {response.status}): {response.detail()}"
            if response.status in (401, 403) and self.spool is not None:
                message += (
                    f"; keeping everything in the spool; send it with a valid token: "
                    f"noisescope sync {self.spool.root} --url {redact_url(self.settings.url)} "
                    "--token <TOKEN>"
                )
        self.refusal = message
        self._on(Signal.REFUSED)
        self._error(message, key="run-refused", level=logging.WARNING)

    def _heartbeat(self) -> None:
        """Tell the server the run is alive (empty POST, 204); a server without the endpoint
        (404, 405) or one that refuses it is not asked again."""
        response = self._request("POST", _wire.heartbeat_path(self.run_id), None)
        if response is None:
            return
        if classify(response) == "fatal" or response.status == 404:
            self._heartbeats = False
            self._last_contact = time.monotonic()
            logger.debug("noisescope: no heartbeat endpoint (HTTP %d)", response.status)
            return
        self._answered(response)

    def _tell_page(self, response: Response) -> None:
        """The run's link from the server's answer, if it has one; never fails the send."""
        if self._on_page is None:
            return
        try:
            link = answer_field(response, "dashboard_url")
            if link is not None:
                self._on_page(link)
        except Exception:  # an old server, a proxy's page: no link, nothing else changes
            logger.debug("noisescope: no run link in the answer to PUT", exc_info=True)

    def _post(self, columns: Columns, fresh: bool = False) -> Outcome | None:
        """POST one batch: the outcome, or None if there was no answer. Samples the server
        refuses by index are dropped (counted) and the rest sent again at once. ``fresh``: the
        batch's first request (not a replay), so samples the server already held are not
        re-sends but another session's with the same numbers, and are counted."""
        while True:
            response = self._request("POST", _wire.samples_path(self.run_id), {"columns": columns})
            if response is None:
                return None
            outcome = self._answered(response)
            if outcome != "fatal":
                break
            rest = self._without_refused(columns, response)
            if rest is None:
                break
            columns = rest
        count = len(columns["seq"])
        if outcome == "ok" and self.outbox.answered_inflight():
            # the guard's copy is counted when the spool replays it, all but these
            already = count - inserted(response, count) if fresh else 0
            if already:
                self._count_already_stored(already)
                self._copies_already_stored += already
            self._last_send = time.monotonic()
        elif outcome == "ok":
            stored = inserted(response, count)
            self.inserted += stored
            if fresh and stored < count:
                self._count_already_stored(count - stored)
                count = stored
            elif self._copies_already_stored:  # a replay: of such a copy, perhaps
                counted = min(self._copies_already_stored, count - stored)
                self._copies_already_stored -= counted
                count -= counted
            self.sent += count
            self._last_send = time.monotonic()
        elif outcome == "missing":
            # The server lost the run (database reset?): create it again, then resend.
            self._enter_outage(f"HTTP 404: {response.detail()}", 0.0, warn=False, lost=True)
        elif outcome == "fatal":
            why = f"the server rejected them (HTTP {response.status}): {response.detail()}"
            self.outbox.drop(count, f"rejected-{response.status}", why)
            self._error(
                f"server rejected {count} samples (HTTP {response.status}): {response.detail()}",
                key=f"rejected-{response.status}",
                level=logging.WARNING,
            )
        return outcome

    def _count_already_stored(self, count: int) -> None:
        """Samples of a first request that the server already held: its (run, seq) pairs were
        taken by another session of the same run id, whose samples the server keeps."""
        why = (
            "the server already held samples with their sequence numbers: the run id was used "
            "before (init(run_id=...) of an earlier run, or two processes sharing one without "
            "all_ranks=True), so this session's samples were numbered from 0 again and the "
            "server kept the earlier ones; start a new run (a new run_id) instead"
        )
        self.outbox.drop(count, "already-stored", why)
        self._error(
            f"{count} samples not stored: {why}", key="already-stored", level=logging.WARNING
        )

    def _without_refused(self, columns: Columns, response: Response) -> Columns | None:
        """``columns`` less the samples a 422 names (``"rows"``), which are counted dropped;
        None when the answer names none, or all of them (then the batch is refused whole)."""
        count = len(columns["seq"])
        refused = refused_rows(response, count)
        if not refused or len(refused) >= count:
            return None
        why = f"the server refused them (HTTP {response.status}): {response.detail()}"
        if not self.outbox.inflight_was_spooled():  # else the spool's replay counts them
            self.outbox.drop(len(refused), f"rejected-{response.status}", why)
        self._error(
            f"server refused {len(refused)} of {count} samples (HTTP {response.status}): "
            f"{response.detail()}; sending the other {count - len(refused)}",
            key=f"refused-rows-{response.status}",
            level=logging.WARNING,
        )
        named = set(refused)
        return select_rows(columns, [i for i in range(count) if i not in named])

    def _replay_spool(self) -> bool:
        """Send spooled batches, oldest first; a segment is deleted once all of it is taken.

        Consecutive spooled batches are merged into requests of up to ``replay_max`` samples:
        after an outage the backlog drains in a few large requests, not many small ones.
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
            for last, kind, payload in replay_requests(records, done, self.replay_max):
                if kind == "events":
                    outcome = self._post_events(payload["events"])
                else:
                    outcome = self._post(payload["columns"])
                if not _delivered(outcome):
                    return False
                samples = len(payload["columns"]["seq"]) if kind == "samples" else 0
                self.spool.acknowledge(path, last + 1, samples)
            self.spool.discard(path)
        return True

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
            if not delivered:
                return False
        return True

    def _post_events(self, events: list[Any]) -> Outcome | None:
        response = self._request("POST", _wire.events_path(self.run_id), {"events": events})
        outcome = None if response is None else self._answered(response)
        if outcome == "missing":
            self._enter_outage("HTTP 404: unknown run", 0.0, warn=False, lost=True)
        if outcome == "fatal" and response is not None:
            self.outbox.dropped_events += len(events)
            self._error(
                f"server rejected {len(events)} events (HTTP {response.status}): "
                f"{response.detail()}",
                key=f"events-rejected-{response.status}",
                level=logging.WARNING,
            )
        return outcome

    def _send_final(self, final: Mapping[str, Any]) -> None:
        response = self._request("PATCH", _wire.runs_path(self.run_id), final)
        if response is not None and self._answered(response) != "retry":
            self._say_server_warnings(response)
            self._on(Signal.FINAL_TAKEN)

    def _say_server_warnings(self, response: Response) -> None:
        """What the server stored otherwise than sent (its answer's ``warnings``: a time from
        a clock ahead of the server's), each said once."""
        said = answer_field(response, "warnings")
        for warning in said if isinstance(said, list) else []:
            if isinstance(warning, str) and warning.isprintable():
                self._error(f"the server says: {warning[:300]}", key=f"server:{warning[:80]}")

    @property
    def final_sent(self) -> bool:
        """Whether the server took the run's final status (then the spool may go)."""
        return self.state.final_sent

    def save_meta(self) -> None:
        """Write run.json: what ``noisescope sync`` needs to deliver this run (on a full disk
        the spool writes it before its first batch, or takes none)."""
        assert self.spool is not None
        with contextlib.suppress(OSError):
            self.spool.write_meta(
                {
                    "run_id": self.run_id,
                    "url": redact_url(self.settings.url),  # no password on disk
                    "run": self.run_body,
                    "mode": self.settings.mode,
                }
            )

    def _error(self, message: str, key: str | None, level: int = logging.DEBUG) -> None:
        message = redact_text(message)
        self.last_error = message
        if key is not None and key not in self._warned:
            self._warned.add(key)
            logger.log(max(level, logging.WARNING), "noisescope: %s", message)
