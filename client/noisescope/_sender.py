"""The background sender: batches committed samples, POSTs them, retries, spools.

One daemon thread per run. The training thread only appends ``Sample`` tuples to a ``deque``
(the ``Backlog``); this thread takes them in batches (by count: ``batch_max``; by time:
``batch_interval``), converts them to columns (``_records``) and POSTs them through a
``Transport`` (``_request`` builds the bodies).

Failure policy (why it is safe):
- connection errors, timeouts, 408, 429 and 5xx are *retryable* (``_retry``): the batch goes to
  the on-disk spool at once (durable), the sender backs off exponentially with jitter (honouring
  ``Retry-After``) and, while the outage lasts, spills new batches to the spool instead of
  holding them in memory. When a retry succeeds the spool is replayed, oldest first. A request
  that hangs is covered by the backlog's ``Guard``.
- other 4xx are the client's fault: logged once with the server's message, never retried; the
  batch is counted as dropped. A refused run creation (401/403: a token problem; or an answer
  no noisescope server gives) switches the run to spooling, so ``noisescope sync --token`` can
  deliver it later.
- every sample carries (run id, seq); the server inserts-or-ignores, so a replay or a retry of a
  batch whose answer was lost never double-counts.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from noisescope import _wire
from noisescope._backlog import Backlog, Guard
from noisescope._config import Settings
from noisescope._records import Sample, json_safe, rows_to_columns
from noisescope._request import build_request, is_loopback
from noisescope._retry import (
    Backoff,
    Outcome,
    classify,
    not_noisescope,
    not_noisescope_problem,
    parse_retry_after,
)
from noisescope._spool import Columns, RunSpool, replay_requests
from noisescope._sync import deliver_orphans
from noisescope._transport import Response, Transport, TransportError

logger = logging.getLogger("noisescope")


class Phase(enum.Enum):
    """The sender thread's life."""

    #: Sending samples as they come.
    RUNNING = "running"
    #: ``close()`` was called: send everything now, then the final status, then exit.
    STOPPING = "stopping"
    #: ``close()`` stopped waiting: what is left goes to the spool.
    ABANDONED = "abandoned"


class Link(enum.Enum):
    """The run as the server knows it."""

    #: Not created yet (or the server lost it: a 404).
    NEW = "new"
    CREATED = "created"
    #: The server refused the run (a token, not a noisescope server): the spool keeps it.
    REFUSED = "refused"
    #: The final status was taken: nothing more to send.
    FINISHED = "finished"


#: Seconds ``close`` waits before it says that it is waiting for the server.
SLOW_CLOSE = 1.0


class Sender:
    """Moves committed rows from ``buffer`` to the server (or the spool) on its own thread."""

    def __init__(
        self,
        settings: Settings,
        run_id: str,
        run_body: dict[str, Any],
        buffer: deque[Sample],
        transport: Transport | None,
        spool: RunSpool | None,
        commit_open: Callable[[], None] | None = None,
        *,
        on_page: Callable[[Any], None] | None = None,
    ) -> None:
        self.settings = settings
        self.run_id = run_id
        self.run_body = run_body
        self.buffer = buffer
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
        self.backlog = Backlog(settings, buffer, spool, self.series_prefix, self._error)
        #: When the request now on the wire began (None between requests).
        self._request_started: float | None = None
        self._thread: threading.Thread | None = None
        self._guard: Guard | None = None
        self.phase = Phase.RUNNING
        self.link = Link.NEW
        #: Why the server will not take this run (its answer to PUT), when ``Link.REFUSED``.
        self.refusal: str | None = None
        #: gzip large bodies, except to a server on this machine (CPU for nothing there).
        self._compress = not is_loopback(settings.url)
        self._outage_until = 0.0
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
        self._flush_requested = False
        self._final: dict[str, Any] | None = None
        #: Why the run's end could not be recorded in the spool at close, if it could not.
        self.end_unrecorded: str | None = None
        self._orphans_checked = False
        self._warned: set[str] = set()
        # counters
        self.sent = 0
        self.inserted = 0
        self.last_error: str | None = None
        self.requests = 0
        #: Events (``Run.log_event``) waiting to be sent; in memory until sent or spilled.
        self.events = self.backlog.events

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name="noisescope-sender", daemon=True)
        self._thread.start()
        if self.spool is not None and self.transport is not None:
            self._guard = Guard(
                self.backlog,
                self.settings,
                lambda: self._request_started,
                lambda: self.link is Link.REFUSED,
            )
            self._guard.start()

    @property
    def dropped(self) -> int:
        """Samples lost, each with a reason logged once (spool full, invalid, rejected)."""
        return self.backlog.dropped

    @property
    def dropped_events(self) -> int:
        return self.backlog.dropped_events

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wake(self) -> None:
        self._wake.set()

    def queued(self) -> int:
        return self.backlog.queued()

    def idle(self) -> bool:
        """Nothing in memory and nothing spooled that could still be sent in this process."""
        if self.backlog.in_memory():
            return False
        if self.settings.mode == "offline" or self.link is Link.REFUSED:
            return True
        if self.events:
            return False
        return not (self.spool is not None and self.spool.bytes_used > 0)

    def flush(self, timeout: float) -> bool:
        """Ask for everything to be sent now; wait up to ``timeout``. True if all was sent."""
        self._flush_requested = True
        self._wake.set()
        deadline = time.monotonic() + max(0.0, timeout)
        with self._cond:
            while not self.idle():
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self.alive:
                    break
                self._cond.wait(min(remaining, 0.05))
                self._wake.set()
        self._flush_requested = False
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
        self._final = final
        if self.spool is not None and final is not None:
            try:  # before any wait: what sync needs should the process die meanwhile
                self.spool.write_end(final)
            except OSError as exc:
                self.end_unrecorded = str(exc)
        self._flush_requested = True
        self.phase = Phase.STOPPING
        self._wake.set()
        interrupted = False
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
            self.phase = Phase.ABANDONED
            self._wake.set()
            self.backlog.spill_everything()
            self._thread.join(0.2)
            if not self._thread.is_alive():
                # A batch the thread held during the spill (a failed POST) went back to the
                # buffer after it was drained: spool it or count it too.
                self.backlog.spill_everything()
            self.backlog.spill_events()
        elif self.buffer or self.events:  # thread died or never started
            self.backlog.spill_everything()
            self.backlog.spill_events()
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
                done = self.phase is not Phase.RUNNING
                time.sleep(0.05)
            with self._cond:
                self._cond.notify_all()
            if done or self.phase is Phase.ABANDONED:
                if self._guard is not None:
                    self._guard.stop()
                return

    def _wait_time(self) -> float:
        interval = self.settings.batch_interval
        if self.phase is not Phase.RUNNING or self._flush_requested:
            interval = 0.02
        now = time.monotonic()
        if self._outage_until > now:
            return max(0.0, min(self._outage_until - now, interval))
        return interval

    def _tick(self) -> bool:
        """One pass; returns True when the thread may exit."""
        # One snapshot: close() may end the RUNNING phase mid-pass, and exiting on a later read
        # without having sent the final status would lose it.
        stopping = self.phase is not Phase.RUNNING
        if self._commit_open is not None and (stopping or self._flush_requested):
            self._commit_open()
        if self.settings.mode == "offline" or self.link is Link.REFUSED or self.transport is None:
            self.backlog.spill(force=True)
            self.backlog.spill_events()
            return stopping
        if time.monotonic() < self._outage_until:
            # Keep retrying until close() gives up (its bounded wait); meanwhile stay on disk,
            # events too (replayed with the samples when the server is back).
            self.backlog.spill(force=stopping or self._flush_requested)
            self.backlog.spill_events()
            return False
        if not self._ensure_run():
            return False
        if not self._replay_spool():
            return False
        if not self._send_buffer():
            return False
        if self.events and not self._send_events():
            return False
        if stopping and self._final is not None and not self.final_sent and self.idle():
            self._send_final()
        if (
            not stopping
            and self._heartbeats
            and time.monotonic() - self._last_contact >= self.settings.heartbeat_interval
            and self.idle()
        ):
            self._heartbeat()
        if not self._orphans_checked and not stopping and self.idle():
            self._orphans_checked = True
            self._resume_orphans()
        return stopping and self.idle()

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
            stop=lambda: self.phase is not Phase.RUNNING,
        )
        if problem is not None:
            self._error(problem, key=None)

    # -- sending ------------------------------------------------------------------------------
    def _request(self, method: str, path: str, payload: dict[str, Any] | None) -> Response | None:
        """One request (``payload`` None: an empty body); None (and the outage begins) if there
        was no HTTP answer."""
        assert self.transport is not None
        request = build_request(
            method,
            path,
            payload,
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

    def _enter_outage(self, reason: str, retry_after: float | None, warn: bool = True) -> None:
        delay = self.backoff.next_delay(retry_after)
        self._outage_until = time.monotonic() + delay
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
                self.settings.url,
                reason,
                where,
            )

    def _answered(self, response: Response) -> Outcome:
        self._last_contact = time.monotonic()
        outcome = classify(response)
        if outcome == "retry":
            retry_after = parse_retry_after(response.header("Retry-After"))
            self._enter_outage(f"HTTP {response.status}: {response.detail()}", retry_after)
        elif outcome == "ok":
            self.backoff.reset()
            self._outage_until = 0.0
            if self._outage_error is not None and self.last_error == self._outage_error:
                self.last_error = None
            self._outage_error = None
        return outcome

    def _ensure_run(self) -> bool:
        if self.link is Link.CREATED:
            return True
        response = self._request("PUT", _wire.runs_path(self.run_id), self.run_body)
        if response is None:
            return False
        outcome = "fatal" if not_noisescope(response) else self._answered(response)
        if outcome == "ok":
            self._tell_page(response)
            self.link = Link.CREATED
            return True
        if outcome == "retry":
            return False
        self.refused_status = response.status
        self.not_noisescope = not_noisescope(response)
        if self.not_noisescope:
            request = f"PUT {_wire.runs_path(self.run_id)}"
            message = not_noisescope_problem(self.settings.url, request, response)
        else:
            message = (
                f"server refused run {self.run_id} (HTTP {response.status}): {response.detail()}"
            )
            if response.status in (401, 403) and self.spool is not None:
                message += (
                    f"; send it with a valid token: noisescope sync {self.spool.root} "
                    f"--url {self.settings.url} --token <TOKEN>"
                )
        self.link, self.refusal = Link.REFUSED, message
        self._error(message, key="run-refused", level=logging.WARNING)
        return False

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
            answer = response.json()
            link = answer.get("dashboard_url") if isinstance(answer, dict) else None
            if link is not None:
                self._on_page(link)
        except Exception:  # an old server, a proxy's page: no link, nothing else changes
            logger.debug("noisescope: no run link in the answer to PUT", exc_info=True)

    def _post(self, columns: Columns) -> Outcome | None:
        """POST one batch: the outcome, or None if there was no answer."""
        response = self._request("POST", _wire.samples_path(self.run_id), {"columns": columns})
        if response is None:
            return None
        outcome = self._answered(response)
        count = len(columns["seq"])
        if outcome == "ok" and self.backlog.inflight_was_spooled():
            self._last_send = time.monotonic()
        elif outcome == "ok":
            self.sent += count
            try:
                answer = response.json()
                self.inserted += int(answer.get("inserted", count))
            except (ValueError, AttributeError, TypeError):
                self.inserted += count
            self._last_send = time.monotonic()
        elif outcome == "missing":
            # The server lost the run (database reset?): create it again, then resend.
            self.link = Link.NEW
            self._enter_outage(f"HTTP 404: {response.detail()}", 0.0, warn=False)
        elif outcome == "fatal":
            why = f"the server rejected them (HTTP {response.status}): {response.detail()}"
            self.backlog.drop(count, f"rejected-{response.status}", why)
            self._error(
                f"server rejected {count} samples (HTTP {response.status}): {response.detail()}",
                key=f"rejected-{response.status}",
                level=logging.WARNING,
            )
        return outcome

    def _replay_spool(self) -> bool:
        """Send spooled batches, oldest first; a segment is deleted once all of it is taken.

        Consecutive spooled batches are merged into requests of up to ``replay_max`` samples:
        after an outage the backlog drains in a few large requests, not many small ones.
        """
        if self.spool is None or self.spool.bytes_used <= 0:
            return True
        for path in self.spool.seal():
            done = self.spool.replay_start(path)
            records = self.spool.read(path)
            for last, kind, payload in replay_requests(records, done, self.replay_max):
                if kind == "events":
                    outcome = self._post_events(payload["events"])
                else:
                    outcome = self._post(payload["columns"])
                if outcome is None or outcome in ("retry", "missing"):
                    return False
                samples = len(payload["columns"]["seq"]) if kind == "samples" else 0
                self.spool.acknowledge(path, last + 1, samples)
            self.spool.discard(path)
        return True

    def _send_buffer(self) -> bool:
        while self.buffer:
            due = (
                len(self.buffer) >= self.settings.batch_max
                or self._flush_requested
                or self.phase is not Phase.RUNNING
                or time.monotonic() - self._last_send >= self.settings.batch_interval
            )
            if not due:
                return True
            rows = self.backlog.take(self.settings.batch_max, sending=True)
            columns, invalid = rows_to_columns(rows, self.series_prefix)
            self.backlog.count_invalid(invalid)
            if columns["seq"]:
                outcome = self._post(columns)
                if outcome is None or outcome in ("retry", "missing"):
                    keep = invalid == 0 and self.phase is not Phase.ABANDONED  # else counted
                    if self.backlog.inflight_was_spooled():
                        pass  # the guard spooled it while the request hung
                    elif not self.backlog.to_spool(columns, hold=keep):
                        self.buffer.extendleft(reversed(rows))  # no disk: keep it in memory
                    self.backlog.done_inflight()
                    self.backlog.spill(force=False)
                    return False
            self.backlog.done_inflight()
            if len(self.buffer) > self.settings.memory_max // 2:
                # Producing faster than the server takes: keep memory bounded via the disk.
                self.backlog.spill(force=True)
        self._last_send = time.monotonic()
        return True

    def _send_events(self) -> bool:
        """POST queued events (``{"events": [...]}``); keep them on no or a retryable answer."""
        while self.events:
            batch = [json_safe(self.events.popleft()) for _ in range(min(len(self.events), 1000))]
            self.backlog.begin_events(batch)
            try:
                outcome = self._post_events(batch)
            finally:
                spooled = self.backlog.end_events()
            if (outcome is None or outcome in ("retry", "missing")) and not spooled:
                self.events.extendleft(reversed(batch))
                return False
            if outcome is None or outcome in ("retry", "missing"):
                return False
        return True

    def _post_events(self, events: list[Any]) -> Outcome | None:
        response = self._request("POST", _wire.events_path(self.run_id), {"events": events})
        outcome = None if response is None else self._answered(response)
        if outcome == "missing":
            self.link = Link.NEW
            self._enter_outage("HTTP 404: unknown run", 0.0, warn=False)
        if outcome == "fatal" and response is not None:
            self.backlog.dropped_events += len(events)
            self._error(
                f"server rejected {len(events)} events (HTTP {response.status}): "
                f"{response.detail()}",
                key=f"events-rejected-{response.status}",
                level=logging.WARNING,
            )
        return outcome

    def _send_final(self) -> None:
        assert self._final is not None
        response = self._request("PATCH", _wire.runs_path(self.run_id), self._final)
        if response is not None and self._answered(response) != "retry":
            self.link = Link.FINISHED

    @property
    def final_sent(self) -> bool:
        """Whether the server took the run's final status (then the spool may go)."""
        return self.link is Link.FINISHED

    def make_room(self) -> bool:
        """On the training thread, when the memory buffer is full (``Backlog.make_room``)."""
        return self.backlog.make_room()

    def spool_problem(self) -> str:
        return self.backlog.spool_problem()

    def add_event(self, event: dict[str, Any]) -> None:
        """Queue an event (``Run.log_event``) and wake the thread."""
        self.events.append(event)
        self._wake.set()

    def save_meta(self) -> None:
        """Write run.json: what ``noisescope sync`` needs to deliver this run (on a full disk
        the spool writes it before its first batch, or takes none)."""
        assert self.spool is not None
        with contextlib.suppress(OSError):
            self.spool.write_meta(
                {
                    "run_id": self.run_id,
                    "url": self.settings.url,
                    "run": self.run_body,
                    "mode": self.settings.mode,
                }
            )

    def _error(self, message: str, key: str | None, level: int = logging.DEBUG) -> None:
        self.last_error = message
        if key is not None and key not in self._warned:
            self._warned.add(key)
            logger.log(max(level, logging.WARNING), "noisescope: %s", message)
