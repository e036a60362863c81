"""The background sender: batches committed samples, compresses, POSTs, retries, spools.

One daemon thread per run. The training thread only appends tuples to a ``deque``; this thread
pops them in batches (by count: ``batch_max``; by time: ``batch_interval``), encodes them
column-wise (``_wire``), gzips large bodies and POSTs them through a ``Transport``.

Failure policy (why it is safe):
- connection errors, timeouts, 408, 429 and 5xx are *retryable*: the batch goes to the on-disk
  spool at once (durable), the sender backs off exponentially with jitter (honouring
  ``Retry-After``) and, while the outage lasts, spills new batches to the spool instead of
  holding them in memory. When a retry succeeds the spool is replayed, oldest first.
- other 4xx are the client's fault: logged once with the server's message, never retried; the
  batch is counted as dropped. 401/403 on run creation (a token problem) switch the run to
  spooling, so ``noisescope sync --token`` can deliver it later.
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
from dataclasses import dataclass
from typing import Any

from noisescope import _wire
from noisescope._config import Settings
from noisescope._records import Sample, json_safe, rows_to_columns
from noisescope._request import build_request, is_loopback
from noisescope._retry import Backoff, Outcome, classify, parse_retry_after
from noisescope._spool import Columns, RunSpool, replay_requests, spooled_run_ids
from noisescope._sync import sync_run
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


@dataclass(frozen=True)
class Status:
    """Where every sample of a run is. ``queued + sent + spooled + dropped`` = committed."""

    mode: str
    #: In memory (open step, buffer, or in a request right now).
    queued: int
    #: Acknowledged by the server.
    sent: int
    #: Waiting in the on-disk spool.
    spooled: int
    #: Lost, with a reason logged once: buffer overflow, disk limit, rejected or invalid data.
    dropped: int
    last_error: str | None
    spool_dir: str | None = None

    def line(self) -> str:
        text = (
            f"queued {self.queued}, sent {self.sent}, spooled {self.spooled}, "
            f"dropped {self.dropped}"
        )
        if self.last_error:
            text += f"; last error: {self.last_error}"
        return text


def _is_html(response: Response) -> bool:
    return (response.header("Content-Type") or "").lower().startswith("text/html")


def _not_noisescope(response: Response) -> bool:
    """An answer no noisescope server gives to a run's creation (a 405, or a web page: e.g. the
    Streamlit dashboard's port)."""
    return response.status == 405 or _is_html(response)


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
        self._drain_lock = threading.Lock()
        #: The batch in the request being sent, and whether the guard already spooled a copy.
        self._inflight: list[Sample] | None = None
        self._inflight_spooled = False
        #: Events in the request being sent (a copy may be spooled by the guard likewise).
        self._inflight_events: list[Any] | None = None
        self._inflight_events_spooled = False
        #: Samples taken from the buffer on their way to the spool (counted as queued meanwhile).
        self._spilling = 0
        #: Samples taken from the buffer so far (guard: how far behind the sender is).
        self._taken = 0
        #: When the request now on the wire began (None between requests).
        self._request_started: float | None = None
        self._thread: threading.Thread | None = None
        self._guard_thread: threading.Thread | None = None
        self._guard_stop = threading.Event()
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
        self._last_spill = time.monotonic()
        self._flush_requested = False
        self._final: dict[str, Any] | None = None
        self._orphans_checked = False
        self._warned: set[str] = set()
        #: When a spool write failed (read-only or missing directory), batches are held in
        #: memory (bounded by ``memory_max``) until this time, then the disk is tried again.
        self._spool_retry_at = 0.0
        #: Why the spool last refused samples (for the message about dropped ones).
        self._spool_trouble: str | None = None
        # counters
        self.sent = 0
        self.inserted = 0
        self.dropped = 0
        self.last_error: str | None = None
        self.requests = 0
        #: Events (``Run.log_event``) waiting to be sent; kept in memory only (they are rare).
        self.events: deque[dict[str, Any]] = deque(maxlen=10_000)
        self.dropped_events = 0

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name="noisescope-sender", daemon=True)
        self._thread.start()
        if self.spool is not None and self.transport is not None:
            self._guard_thread = threading.Thread(
                target=self._guard_main, name="noisescope-spool-guard", daemon=True
            )
            self._guard_thread.start()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wake(self) -> None:
        self._wake.set()

    def queued(self) -> int:
        with self._drain_lock:
            inflight = self._inflight if not self._inflight_spooled else None
            return len(self.buffer) + (len(inflight) if inflight else 0) + self._spilling

    def idle(self) -> bool:
        """Nothing in memory and nothing spooled that could still be sent in this process."""
        if self.buffer or self._inflight or self._spilling or self._inflight_events:
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

    def close(self, final: dict[str, Any] | None, timeout: float) -> None:
        """Flush for at most ``timeout``; spool what is left; stop the thread."""
        self._final = final
        if self.spool is not None:
            self.save_meta()
        self._flush_requested = True
        self.phase = Phase.STOPPING
        self._wake.set()
        if self._thread is not None:
            self._thread.join(max(0.0, timeout))
        if self._thread is not None and self._thread.is_alive():
            # The server did not take everything in time: leave the rest on disk.
            self.phase = Phase.ABANDONED
            self._wake.set()
            self._spill_everything()
            self._thread.join(0.2)
            if not self._thread.is_alive():
                # A batch the thread held during the spill (a failed POST) went back to the
                # buffer after it was drained: spool it or count it too.
                self._spill_everything()
            self._spill_events()
        elif self.buffer or self.events:  # thread died or never started
            self._spill_everything()
            self._spill_events()
        self._guard_stop.set()
        if self.transport is not None and not self.alive:
            with contextlib.suppress(Exception):
                self.transport.close()

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
                self._guard_stop.set()
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
            self._spill(force=True)
            self._spill_events()
            return stopping
        if time.monotonic() < self._outage_until:
            # Keep retrying until close() gives up (its bounded wait); meanwhile stay on disk,
            # events too (replayed with the samples when the server is back).
            self._spill(force=stopping or self._flush_requested)
            self._spill_events()
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
        """Deliver spools that earlier *online* runs of this server left behind (a job killed
        during an outage), once per run, when this run's own data is all sent. Offline runs
        wait for an explicit ``noisescope sync``; runs locked by a live process are skipped."""
        if self.spool is None or self.transport is None or not self.settings.resume_orphans:
            return
        for run_id in spooled_run_ids(self.spool.root):
            if run_id == self.spool.dir.name or self.phase is not Phase.RUNNING:
                continue
            orphan = RunSpool.at(self.spool.root, run_id)  # a valid name: spooled_run_ids
            meta = orphan.read_meta() or {}
            if meta.get("mode") != "online" or meta.get("url") != self.settings.url:
                continue
            try:
                if not orphan.acquire():
                    continue
            except OSError:
                continue
            try:
                count = sync_run(orphan, self.transport, compress=self._compress)
                orphan.remove_if_empty()
                logger.info("noisescope: delivered %d spooled samples of run %s", count, run_id)
            except Exception as exc:  # leave it for the next run or `noisescope sync`
                self._error(f"could not deliver spooled run {run_id}: {exc}", key=None)
                return
            finally:
                orphan.release()

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
        return outcome

    def _ensure_run(self) -> bool:
        if self.link is Link.CREATED:
            return True
        response = self._request("PUT", _wire.runs_path(self.run_id), self.run_body)
        if response is None:
            return False
        outcome = "fatal" if _not_noisescope(response) else self._answered(response)
        if outcome == "ok":
            self._tell_page(response)
            self.link = Link.CREATED
            return True
        if outcome == "retry":
            return False
        self.refused_status = response.status
        if _not_noisescope(response):
            message = (
                f"{self.settings.url} is not a noisescope server: it answered PUT "
                f"{_wire.runs_path(self.run_id)} with HTTP {response.status}"
                f"{' and a web page' if _is_html(response) else ''} (the dashboard?); the "
                "server's default port is 8765 (set url= or NOISESCOPE_URL). The run is kept "
                "in the spool"
            )
        else:
            message = (
                f"server refused run {self.run_id} (HTTP {response.status}): "
                f"{response.detail()}; the run is kept in the spool"
            )
            if response.status in (401, 403) and self.spool is not None:
                message += (
                    f": send it with a valid token: noisescope sync {self.spool.root} "
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
        if outcome == "ok" and self._claim_inflight():
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
            self.dropped += count
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
            rows = self._take(self.settings.batch_max, sending=True)
            columns, invalid = rows_to_columns(rows, self.series_prefix)
            self._count_invalid(invalid)
            if columns["seq"]:
                outcome = self._post(columns)
                if outcome is None or outcome in ("retry", "missing"):
                    keep = invalid == 0 and self.phase is not Phase.ABANDONED  # else counted
                    if self._claim_inflight():
                        pass  # the guard spooled it while the request hung
                    elif not self._to_spool(columns, hold=keep):
                        self.buffer.extendleft(reversed(rows))  # no disk: keep it in memory
                    self._done_inflight()
                    self._spill(force=False)
                    return False
            self._done_inflight()
            if len(self.buffer) > self.settings.memory_max // 2:
                # Producing faster than the server takes: keep memory bounded via the disk.
                self._spill(force=True)
        self._last_send = time.monotonic()
        return True

    def _send_events(self) -> bool:
        """POST queued events (``{"events": [...]}``); keep them on no or a retryable answer."""
        while self.events:
            batch = [json_safe(self.events.popleft()) for _ in range(min(len(self.events), 1000))]
            with self._drain_lock:
                self._inflight_events, self._inflight_events_spooled = batch, False
            try:
                outcome = self._post_events(batch)
            finally:
                with self._drain_lock:
                    spooled = self._inflight_events_spooled
                    self._inflight_events, self._inflight_events_spooled = None, False
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
            self.dropped_events += len(events)
            self._error(
                f"server rejected {len(events)} events (HTTP {response.status}): "
                f"{response.detail()}",
                key=f"events-rejected-{response.status}",
                level=logging.WARNING,
            )
        return outcome

    def _spill_events(self) -> None:
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

    def _send_final(self) -> None:
        assert self._final is not None
        response = self._request("PATCH", _wire.runs_path(self.run_id), self._final)
        if response is not None and self._answered(response) != "retry":
            self.link = Link.FINISHED
            if self.spool is not None:
                self.save_meta()

    # -- spooling -----------------------------------------------------------------------------
    def _take(self, limit: int, sending: bool) -> list[Sample]:
        """Up to ``limit`` rows, oldest first: the batch of the next request (``sending``) or
        rows on their way to the spool (release them with ``_done_spilling``)."""
        with self._drain_lock:
            rows: list[Sample] = []
            popleft = self.buffer.popleft
            try:
                for _ in range(limit):
                    rows.append(popleft())
            except IndexError:
                pass
            self._taken += len(rows)
            if sending:
                self._inflight, self._inflight_spooled = rows, False
            else:
                self._spilling += len(rows)
            return rows

    def _done_inflight(self) -> None:
        with self._drain_lock:
            self._inflight, self._inflight_spooled = None, False

    def _done_spilling(self, count: int) -> None:
        with self._drain_lock:
            self._spilling -= count

    def _claim_inflight(self) -> bool:
        """Whether the guard spooled the batch in the request (then the spool's replay, not
        this request, counts it as sent; a failed request need not spool it again)."""
        with self._drain_lock:
            return self._inflight_spooled

    # -- the guard: the crash-loss bound whatever the server does ------------------------------
    def _guard_main(self) -> None:
        """While a request hangs (a server that accepts but does not answer) the sender thread
        cannot spill; this thread does, so a process killed at any moment has every sample
        committed more than about ``batch_interval`` ago on the server or on disk."""
        period = self.settings.batch_interval / 4.0
        history: deque[tuple[float, int]] = deque()
        while not self._guard_stop.wait(period):
            try:
                self._guard_tick(history)
            except Exception as exc:  # the guard must never die either
                self._error(f"internal error: {type(exc).__name__}: {exc}", key="internal")
                logger.debug("noisescope spool guard error", exc_info=True)

    def _guard_tick(self, history: deque[tuple[float, int]]) -> None:
        if self.link is Link.REFUSED or not self._spool_usable():
            return
        now = time.monotonic()
        interval = self.settings.batch_interval
        with self._drain_lock:
            taken, committed = self._taken, self._taken + len(self.buffer)
        history.append((now, committed))
        behind = False  # rows committed over batch_interval ago still in memory
        while history and now - history[0][0] >= interval:
            behind = taken < history[0][1]
            history.popleft()
        started = self._request_started
        hung = started is not None and now - started >= interval / 2.0
        if not hung and not behind:
            return
        if hung:
            self._spool_inflight()
        self._spill(force=True)
        self._spill_events()

    def _spool_inflight(self) -> None:
        """A copy of the batch (and the events) in a hung request to the spool, once: a
        duplicate is harmless (the server ignores a (run, seq) it has)."""
        with self._drain_lock:
            rows = self._inflight if not self._inflight_spooled else None
            self._inflight_spooled = self._inflight_spooled or rows is not None
            events = self._inflight_events if not self._inflight_events_spooled else None
            self._inflight_events_spooled = self._inflight_events_spooled or events is not None
        if rows:
            columns, _ = rows_to_columns(rows, self.series_prefix)
            if columns["seq"] and not self._to_spool(columns, hold=True):
                with self._drain_lock:
                    self._inflight_spooled = False  # not on disk after all
        if events:
            try:
                ok = self.spool is not None and self.spool.append_record({"events": events})
            except OSError:
                ok = False
            if not ok:
                with self._drain_lock:
                    self._inflight_events_spooled = False

    # -- overflow: a burst faster than the sender --------------------------------------------
    def make_room(self) -> bool:
        """On the training thread, when the memory buffer is full: move its older half to the
        spool (back-pressure: the caller waits for the disk). False if the spool cannot take
        it (then the caller counts the overflow as dropped)."""
        if not self._spool_usable():
            return False
        target = self.settings.memory_max // 2
        while len(self.buffer) > target:
            rows = self._take(min(self.settings.batch_max, len(self.buffer) - target), False)
            if not rows:
                break
            columns, invalid = rows_to_columns(rows, self.series_prefix)
            self._count_invalid(invalid)
            if columns["seq"] and not self._to_spool(columns, hold=True):
                self.buffer.extendleft(reversed(rows))
                self._done_spilling(len(rows))
                return False
            self._done_spilling(len(rows))
        return True

    def spool_problem(self) -> str:
        """Why the spool cannot take samples now (for a message about dropped ones)."""
        if self.spool is None:
            return "there is no spool (see the warning at init)"
        return self._spool_trouble or "the spool could not take them"

    def _spill(self, force: bool) -> None:
        """Move buffered rows to the spool: all of them if ``force`` or ``batch_interval`` has
        passed since the last spill (so an outage keeps at most that much in memory), else
        whole batches only. Without a usable spool the rows stay in memory, where the hot path
        bounds them at ``memory_max`` (counting the overflow as dropped)."""
        if not self._spool_usable():
            return
        now = time.monotonic()
        if now - self._last_spill >= self.settings.batch_interval:
            force = True
        if self.buffer and force:
            self._last_spill = now
        while self.buffer and (force or len(self.buffer) >= self.settings.batch_max):
            rows = self._take(self.settings.batch_max, sending=False)
            columns, invalid = rows_to_columns(rows, self.series_prefix)
            self._count_invalid(invalid)
            if columns["seq"] and not self._to_spool(columns, hold=invalid == 0):
                self.buffer.extendleft(reversed(rows))  # no disk: keep them in memory
                self._done_spilling(len(rows))
                return
            self._done_spilling(len(rows))

    def _spool_usable(self) -> bool:
        return self.spool is not None and time.monotonic() >= self._spool_retry_at

    def _spill_everything(self) -> None:
        """Called on the caller's thread at close when the wait ran out."""
        self._spool_retry_at = 0.0  # last chance: try the disk
        with self._drain_lock:
            inflight = self._inflight if not self._inflight_spooled else None
        if inflight:
            # Possibly being sent right now: a duplicate in the spool is harmless (seq).
            columns, _ = rows_to_columns(inflight, self.series_prefix)
            if columns["seq"]:
                self._to_spool(columns, count_dropped=False)
        self._spill(force=True)
        with self._drain_lock:  # what neither the server nor the disk took is lost: count it
            left = len(self.buffer)
            self.buffer.clear()
        if left:
            self.dropped += left
            self._error(f"{left} samples could not be sent or spooled", key="lost-at-exit")
        self._spill_events()

    def _to_spool(self, columns: Columns, count_dropped: bool = True, hold: bool = False) -> bool:
        """Append a batch to the spool. With ``hold``, a batch the disk cannot take (no spool,
        I/O error) is not counted dropped: False tells the caller to keep it in memory."""
        count = len(columns["seq"])
        if self.spool is None or not self._spool_usable():
            if hold:
                return False
            if count_dropped:
                self.dropped += count
            return True
        try:
            ok = self.spool.append(columns)
        except OSError as exc:
            self._spool_retry_at = time.monotonic() + 5.0
            self._spool_trouble = f"the spool {self.spool.dir} cannot be written ({exc})"
            self._error(
                f"cannot write spool {self.spool.dir}: {exc}; keeping samples in memory "
                f"(up to {self.settings.memory_max}) while the server is unreachable",
                key="spool-io",
                level=logging.WARNING,
            )
            if hold:
                return False
            if count_dropped:
                self.dropped += count
            return True
        if not ok and count_dropped:
            self.dropped += count
            self._spool_trouble = (
                f"the spool limit of {self.spool.max_bytes} bytes is reached at {self.spool.dir}"
            )
            self._error(
                f"{self._spool_trouble}; newer samples are dropped, {self.dropped} so far "
                "(raise spool_max_bytes or run `noisescope sync`)",
                key="spool-full",
                level=logging.WARNING,
            )
        return True

    def _count_invalid(self, invalid: int) -> None:
        if invalid:
            self.dropped += invalid
            self._error(
                f"{invalid} samples had non-finite or non-numeric squared norms/batch sizes",
                key="invalid",
                level=logging.WARNING,
            )

    @property
    def final_sent(self) -> bool:
        """Whether the server took the run's final status (then the spool may go)."""
        return self.link is Link.FINISHED

    def add_event(self, event: dict[str, Any]) -> None:
        """Queue an event (``Run.log_event``) and wake the thread."""
        self.events.append(event)
        self._wake.set()

    def save_meta(self) -> None:
        """Write run.json: what ``noisescope sync`` needs to deliver this run."""
        assert self.spool is not None
        with contextlib.suppress(OSError):
            self.spool.write_meta(
                {
                    "run_id": self.run_id,
                    "url": self.settings.url,
                    "run": self.run_body,
                    "final": None if self.final_sent else self._final,
                    "mode": self.settings.mode,
                }
            )

    def _error(self, message: str, key: str | None, level: int = logging.DEBUG) -> None:
        self.last_error = message
        if key is not None and key not in self._warned:
            self._warned.add(key)
            logger.log(max(level, logging.WARNING), "noisescope: %s", message)
