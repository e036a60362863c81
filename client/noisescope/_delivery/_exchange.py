"""One run's requests and what the server's answers mean (``Exchange``, the ``Sender``'s base).

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
from noisescope._delivery._outbox import Outbox
from noisescope._delivery._state import Link, Signal, State, initial, transition
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
from noisescope._spool import Columns, RunSpool
from noisescope._transport import HTTPTransport, Response, Transport, TransportError

logger = logging.getLogger("noisescope")

#: Why samples of a deleted run were not delivered (completes "... samples dropped because").
_DELETED_WHY = (
    "the run was deleted on the server (HTTP 410): nothing more of it is sent; start a new run "
    "to record this job"
)


class Exchange:
    """The requests of one run and the meaning of their answers: run creation, samples,
    events, heartbeat, final status, outages. ``Sender`` decides when each is made."""

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
        first_index: int = 0,
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
        #: Wakes the sender's thread (a commit, a flush, close); ``_cond`` paces a flush's wait.
        self._wake = threading.Event()
        self._cond = threading.Condition()
        #: The one owner of what is committed and not yet acknowledged.
        self.outbox = Outbox(
            settings, spool, self.series_prefix, self._error, self._wake.set, first_index
        )
        #: What the thread does next depends on this only; changed by ``_on`` alone.
        self.state: State = initial(has_server=transport is not None)
        self._state_lock = threading.Lock()
        #: When the request now on the wire began (None between requests).
        self._request_started: float | None = None
        #: Why the server will not take this run (its answer to PUT), when ``Link.REFUSED``.
        self.refusal: str | None = None
        #: What the server said when it answered that the run was deleted (``Link.GONE``).
        self.deleted: str | None = None
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

    @property
    def dropped_events(self) -> int:
        return self.outbox.dropped_events

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
        elif outcome == "gone":
            self._deleted(response)
        elif response.status in (401, 403) and self.state.link is Link.CREATED:
            self._refuse(response, "no longer takes run")
            return "refused"
        return outcome

    def _deleted(self, response: Response) -> None:
        """The server says the run was deleted (410): from now on nothing of it is sent or
        spooled, what is left is counted dropped (``Sender._drop_deleted``), and it is never
        created again; said once, with the server's remedy."""
        if self.state.gone:
            return
        self._on(Signal.DELETED)
        self.deleted = (
            f"run {self.run_id} was deleted on the server (HTTP 410: {response.detail()}); "
            "nothing more of it is sent, and what it did not deliver is counted dropped. To "
            "record this job, start a new run (init() with a new run_id, or none)"
        )
        self._error(self.deleted, key="run-deleted", level=logging.WARNING)

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
        if outcome == "retry" or outcome == "gone":
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

    def _post(
        self, columns: Columns, fresh: bool = False, *, alone: bool = True, replay: bool = False
    ) -> Outcome | None:
        """POST one batch: the outcome, or None if there was no answer. Samples the server
        refuses by index are dropped (counted) and the rest sent again at once. ``fresh``: the
        batch's first request (not a replay), so samples the server already held are not
        re-sends but another session's with the same numbers, and are counted. ``alone``
        False: the batch merges several spooled records, and a refusal of the whole of it is
        neither counted nor said (the caller sends each record alone, so that one refused
        record costs only its own samples). ``replay``: the batch is in the spool, which
        counts it should the run turn out deleted."""
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
        elif outcome == "gone" and not replay and not self.outbox.answered_inflight():
            self.outbox.drop(count, "run-deleted", _DELETED_WHY)
        elif outcome == "fatal" and alone:
            if not self.outbox.answered_inflight():  # else its copy in the spool counts it
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

    def _post_events(self, events: list[Any], replay: bool = False) -> Outcome | None:
        """POST events; those refused, or of a deleted run, are counted dropped (once: see
        below). ``replay``: the events are a spool record."""
        response = self._request("POST", _wire.events_path(self.run_id), {"events": events})
        outcome = None if response is None else self._answered(response)
        if outcome == "missing":
            self._enter_outage("HTTP 404: unknown run", 0.0, warn=False, lost=True)
        # a copy the guard spooled is counted when the spool is replayed (or, for a deleted
        # run, discarded); a replay's refusal is counted here, its deletion by the discard
        copied = outcome in ("fatal", "gone") and self.outbox.events_were_spooled()
        if outcome == "gone" and not (copied or replay):
            self.outbox.dropped_events += len(events)
        if outcome == "fatal" and response is not None:
            if not copied:
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
