"""``noisescope.init()`` and ``Run``: the training loop's side of the client.

The hot path (``log_sample``, ``log``) takes a lock, updates the open record of the current step
and, when a later step begins, hands the finished records to the delivery's ``Outbox``, their
one owner. No I/O, no encoding, no validation on the caller's thread: all of that is the
sender's job (``_delivery``). Every public method swallows its own exceptions: a monitoring
client must never take a training job down.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from types import TracebackType
from typing import Any

from noisescope import _json, _process, _wire
from noisescope._config import Settings, resolve, server_url_for
from noisescope._delivery import Sender
from noisescope._records import (
    OPEN_B_BIG,
    OPEN_B_SMALL,
    OPEN_EXAMPLES,
    OPEN_G_BIG_SQ,
    OPEN_G_SMALL_SQ,
    OPEN_LOSS,
    OPEN_LR,
)
from noisescope._redact import redact_url
from noisescope._resume import Resume, resume_mode
from noisescope._spool import RunSpool
from noisescope._status import Status, dropped_account
from noisescope._transport import HTTPTransport, Transport
from noisescope._wire import run_page_url

logger = logging.getLogger("noisescope")


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat()


def _keep_nothing(records: Iterable[list[Any]]) -> None:
    """Where a Run that sends nothing (disabled, a forked child) commits its records."""


class Run:
    """One training run. Create it with :func:`noisescope.init`."""

    def __init__(
        self,
        settings: Settings,
        *,
        project: str,
        task: str,
        name: str | None,
        config: dict[str, Any] | None,
        tags: list[str] | None,
        batch_size: float | None,
        units: str,
        run_id: str | None,
        transport: Transport | None,
        parent_run_id: str | None = None,
        branch_step: int | None = None,
        resume: bool | str = False,
    ) -> None:
        problem = _wire.units_problem(units)
        if problem is not None:
            raise ValueError(problem)
        if run_id is not None:
            problem = _wire.run_id_problem(run_id)
            if problem is not None:  # it names a spool folder and a URL path segment
                raise ValueError(problem)
        if parent_run_id is not None and (problem := _wire.run_id_problem(parent_run_id)):
            raise ValueError(f"parent_run_id: {problem}")
        if (parent_run_id is None) != (branch_step is None):
            raise ValueError("parent_run_id and branch_step go together (a branch of a run)")
        if branch_step is not None and (
            isinstance(branch_step, bool) or not isinstance(branch_step, int) or branch_step < 0
        ):
            raise ValueError(f"branch_step must be an integer >= 0, got {branch_step!r}")
        #: The run this one branched from, and the parent's step it started at (noisescope.branch).
        self.parent_run_id = parent_run_id
        self.branch_step = branch_step
        self.settings = settings
        self.id = run_id or uuid.uuid4().hex
        self.project = project
        self.task = task
        self.name = name or f"run-{self.id[:8]}"
        self.config = _json.jsonable(config or {})
        self.tags = [str(t) for t in (tags or [])]
        problem = _wire.run_fields_problem(
            project=project, task=task, name=self.name, config=self.config, tags=self.tags
        )
        if problem is not None:  # the server would refuse the run, and sync after it
            raise ValueError(f"noisescope.init: {problem}")
        self.batch_size = batch_size
        self.units = units
        self.mode = settings.mode
        self.rank = settings.rank
        self.world_size = settings.world_size
        #: Whether this process records anything (mode, rank policy, not a forked child).
        self.active = settings.sends
        self.finished = False
        #: The run's page on the dashboard, once known (client setting or the server's answer).
        self.page_url: str | None = None

        self._lock = threading.Lock()
        #: Where finished steps go: the sender's ``Outbox.commit`` once there is one.
        self._commit_records: Callable[[Iterable[list[Any]]], None] = _keep_nothing
        self._open: dict[str, list[Any]] = {}
        self._step: Any = None
        self._step_loss: Any = None
        self._step_lr: Any = None
        self._step_examples: Any = None
        self._event_seq = 0
        self._hot_errors = 0
        self._pid = os.getpid()

        self._spool: RunSpool | None = None
        self._sender: Sender | None = None
        #: A resumed session (``init(resume=...)``): its numbering and repeated steps.
        self._resume_mode = resume_mode(resume)
        if self._resume_mode is not None and run_id is None:
            raise ValueError("resume needs the run's id: init(run_id=..., resume=True)")
        self._resume: Resume | None = None
        #: The status ``finish()`` records, and whether a signal cut that finish short.
        self._final_status = "finished"
        self._cut_short = False
        if self.active:
            if self.mode == "online" and settings.dashboard_url:  # before the sender can learn it
                self._found_page(run_page_url(settings.dashboard_url, self.id))
            self._start(transport)
        _process.track(self)

    def _start(self, transport: Transport | None) -> None:
        settings = self.settings
        body = _wire.run_body(
            project=self.project,
            task=self.task,
            name=self.name,
            config=self.config,
            tags=self.tags,
            batch_size=self.batch_size,
            units=self.units,
            started_at=_now_iso(),
            parent_run_id=self.parent_run_id,
            branch_step=self.branch_step,
        )
        try:
            shared = settings.all_ranks and settings.world_size > 1
            name = f"{self.id}.rank{settings.rank}" if shared else None
            spool = RunSpool(settings.dir, self.id, settings.spool_max_bytes, name=name)
            if spool.acquire():
                self._spool = spool
            else:
                logger.warning("noisescope: spool %s is locked by another process", spool.dir)
        except OSError as exc:
            logger.warning("noisescope: no spool (%s); an outage may drop samples", exc)
        if settings.mode == "online" and transport is None:
            transport = HTTPTransport(settings.url, settings.token, settings.request_timeout)
        if settings.mode == "offline":
            transport = None
        if self._resume_mode is not None:
            where = redact_url(settings.url)
            self._resume = Resume.read(self.id, self._resume_mode, transport, self._spool, where)
            self._event_seq = self._resume.first_index
        self._sender = Sender(
            settings,
            self.id,
            body,
            transport,
            self._spool,
            self._commit_open,
            on_page=self._found_page,
            first_index=0 if self._resume is None else self._resume.first_index,
        )
        self._commit_records = self._sender.outbox.commit
        if self._spool is not None:
            self._sender.save_meta()
        self._sender.start()

    # -- the hot path -------------------------------------------------------------------------
    def log_sample(
        self,
        step: int,
        b_small: float,
        b_big: float,
        g_small_sq: float,
        g_big_sq: float,
        *,
        examples: float | None = None,
        series: str = "",
        loss: float | None = None,
        lr: float | None = None,
    ) -> None:
        """Record one two-batch measurement: |G_small|² at ``b_small``, |G_big|² at ``b_big``.

        The estimator (docs/science.md, two-batch estimator) needs both squared norms of the *same*
        step. Values for one (step, series) are merged until a later step begins.
        """
        if not self.active:
            return
        try:
            if self._resume is not None and self._resume.repeats(step):
                return
            with self._lock:
                if step != self._step:
                    self._advance(step)
                record = self._open.get(series)
                if record is None:
                    self._open[series] = [
                        step, examples, b_small, b_big, g_small_sq, g_big_sq,
                        loss, lr, time.time(), series,
                    ]  # fmt: skip
                else:
                    record[OPEN_B_SMALL] = b_small
                    record[OPEN_B_BIG] = b_big
                    record[OPEN_G_SMALL_SQ] = g_small_sq
                    record[OPEN_G_BIG_SQ] = g_big_sq
                    if examples is not None:
                        record[OPEN_EXAMPLES] = examples
                    if loss is not None:
                        record[OPEN_LOSS] = loss
                    if lr is not None:
                        record[OPEN_LR] = lr
        except Exception as exc:
            self._hot_error(exc)

    def log(
        self,
        step: int | None = None,
        *,
        loss: float | None = None,
        lr: float | None = None,
        examples: float | None = None,
        eval_loss: float | None = None,
    ) -> None:
        """Training scalars for ``step`` (default: the current step), or an evaluation.

        Training scalars are attached to every sample of that step, whether the probe logged
        it before or after this call. Scalars of a step without any sample are not stored.

        ``eval_loss`` is an evaluation at ``step`` (with ``examples`` seen, if given): it is
        sent as an ``eval`` event, never attached to samples. A call with only ``eval_loss``
        (and ``examples``) leaves the training step open, so an evaluation logged late for an
        earlier step does not cut the current step's record short. A non-finite value is
        ignored (counted, warned about once).
        """
        if not self.active:
            return
        try:
            if eval_loss is None or loss is not None or lr is not None:
                with self._lock:
                    if step is not None and step != self._step:
                        self._advance(step)
                    if loss is not None:
                        self._step_loss = loss
                    if lr is not None:
                        self._step_lr = lr
                    if examples is not None:
                        self._step_examples = examples
            if eval_loss is not None:
                self._log_eval(step, eval_loss, examples)
        except Exception as exc:
            self._hot_error(exc)

    def _log_eval(self, step: int | None, eval_loss: float, examples: float | None) -> None:
        value = float(eval_loss)
        if not math.isfinite(value):
            raise ValueError(f"eval_loss must be finite, got {value!r}")
        payload: dict[str, Any] = {"loss": value}
        if examples is not None:
            payload["examples"] = float(examples)
        at = step if step is not None else self._step
        self.log_event(0 if at is None else int(at), _wire.EVAL_EVENT_KIND, payload)

    def log_event(self, step: int, kind: str, payload: dict[str, Any] | None = None) -> None:
        """Mark ``step`` with an event (e.g. ``"batch_size"`` changes); sent in the background.

        Events are rare marks the dashboard draws on the charts. They wait in memory (at most
        10 000) while the server is unreachable and go to the spool in offline mode or when
        ``finish()`` gives up; ``seq`` makes re-sends idempotent.
        """
        if not self.active or self._sender is None:
            return
        try:
            if self._resume is not None and self._resume.repeats_event(int(step)):
                return
            with self._lock:
                seq = self._event_seq
                self._event_seq += 1
            event = {"seq": seq, "step": int(step), "kind": str(kind), "time": time.time()}
            event["payload"] = dict(payload or {})
            problem = _wire.event_problem(event["step"], event["kind"], event["payload"])
            if problem is not None:  # the server would refuse it, and its request with it
                self._sender.outbox.drop_event(problem)
                return
            self._sender.outbox.add_event(event)
        except Exception as exc:
            self._hot_error(exc)

    def _advance(self, step: Any) -> None:
        """Commit the open step (caller holds the lock) and open ``step``."""
        if self._open:
            self._commit()
        self._step = step
        self._step_loss = self._step_lr = self._step_examples = None

    def _commit(self) -> None:
        """The open step's records, with the step's scalars from ``log()``, to the outbox."""
        examples, loss, lr = self._step_examples, self._step_loss, self._step_lr
        if examples is not None or loss is not None or lr is not None:
            for record in self._open.values():
                if record[OPEN_EXAMPLES] is None:
                    record[OPEN_EXAMPLES] = examples
                if record[OPEN_LOSS] is None:
                    record[OPEN_LOSS] = loss
                if record[OPEN_LR] is None:
                    record[OPEN_LR] = lr
        self._commit_records(self._open.values())
        self._open.clear()

    def _commit_open(self) -> None:
        with self._lock:
            if self._open:
                self._commit()
                self._step_loss = self._step_lr = self._step_examples = None
                # keep self._step: a late log() for it starts a fresh (empty) record set

    def _found_page(self, url: Any) -> None:
        """Print the run's dashboard link once, from the client setting at init or from the
        server's answer (on the sender thread). A server's text must look like a link before
        it reaches the user's terminal."""
        if self.page_url is not None or not isinstance(url, str):
            return
        if not (url.startswith(("http://", "https://")) and url.isprintable()):
            return
        self.page_url = url
        logger.info("noisescope: run %s (%s): %s", self.name, self.id, url)
        if not self.settings.quiet:
            print(
                f"noisescope: run {self.name} ({self.id[:8]}): {url}", file=sys.stderr, flush=True
            )

    def _hot_error(self, exc: Exception) -> None:
        self._hot_errors += 1
        if self._hot_errors == 1:
            logger.warning("noisescope: ignoring error in log call: %r", exc)

    # -- status, flush, finish ----------------------------------------------------------------
    def status(self) -> Status:
        """Where the samples are: queued (memory), sent, spooled (disk), dropped."""
        sender = self._sender
        open_count = len(self._open)
        if sender is None:
            return Status(self.mode if self.active else "disabled", open_count, 0, 0, 0, None)
        spooled = self._spool.pending_samples if self._spool is not None else 0
        drops = sender.outbox.drops()
        return Status(
            mode=self.mode,
            queued=open_count + sender.queued(),
            sent=sender.sent,
            spooled=spooled,
            dropped=sum(count for count, _ in drops),
            last_error=dropped_account(drops) or sender.last_error,
            spool_dir=str(self._spool.dir) if self._spool is not None else None,
            dropped_events=sender.dropped_events,
        )

    def flush(self, timeout: float | None = None) -> bool:
        """Commit the open step and wait (bounded) until the server has everything."""
        if not self.active or self._sender is None:
            return True
        try:
            self._commit_open()
            wait = self.settings.flush_timeout if timeout is None else timeout
            return self._sender.flush(wait)
        except Exception as exc:
            self._hot_error(exc)
            return False

    def finish(self, status: str = "finished", timeout: float | None = None) -> Status:
        """Flush (bounded wait), mark the run ended, spool the rest; print one summary line."""
        if self.finished:
            return self.status()
        self.finished = True
        _process.forget(self)
        if not self.active or self._sender is None:
            return self.status()
        try:
            self._commit_open()
            wait = self.settings.flush_timeout if timeout is None else timeout
            final = {"status": status, "ended_at": _now_iso()}
            setting = " (flush_timeout)" if timeout is None else ""
            self._final_status = status
            with _process.finishing(self):
                interrupted = self._sender.close(
                    final, wait, waiting=lambda: self._say_waiting(f"{wait:g} s{setting}")
                )
            if self._cut_short:
                return self.status()  # said and left on disk by the signal's handler
            result = self._end(status)
            if interrupted:
                raise KeyboardInterrupt  # the rest is spooled and said: now stop, as asked
            return result
        except Exception as exc:
            self._hot_error(exc)
            return self.status()

    def _end(self, status: str, why: str | None = None) -> Status:
        """After the sender closed: the finish line (``why``: what cut the finish short), and
        the spool folder removed when nothing is left in it for sync, else released."""
        self.active = False
        result = self.status()
        self._report(result, status, why)
        sender = self._sender
        done = sender is not None and (sender.final_sent or sender.state.gone)
        if self._spool is not None and done:
            self._spool.remove_if_empty()  # an offline run, even empty, waits for sync
        elif self._spool is not None:
            self._spool.release()
        return result

    def cut_short(self, why: str) -> None:
        """A signal ends the process while ``finish()`` waits for the server (``why``): what
        the server has not taken goes to the spool now (what it cannot take is counted), and
        the finish line says so; the caller then ends the process."""
        sender = self._sender
        if sender is None or self._cut_short:
            return
        self._cut_short = True
        sender.abandon()
        self._end(self._final_status, why)

    def _say_ended(self, why: str) -> None:
        """The process is ending without ``finish()`` (``why``): say that the run is
        recorded as failed."""
        if self.finished or not self.active:
            return
        line = f"run {self.name} ({self.id[:8]}): {why}; recording the run as failed"
        logger.warning("noisescope: %s", line)

    def _say_waiting(self, wait: str) -> None:
        """``finish()`` is still waiting for the server: for how long, and what Ctrl-C does."""
        if self._spool is not None:
            keep = f"Ctrl-C keeps the samples in the spool ({self._spool.root})"
        else:
            keep = "Ctrl-C drops the samples not yet sent (there is no spool)"
        line = f"run {self.name} ({self.id[:8]}): waiting up to {wait} for the server at "
        line += f"{redact_url(self.settings.url)}; {keep}"
        logger.info("noisescope: %s", line)
        if not self.settings.quiet:
            print(f"noisescope: {line}", file=sys.stderr, flush=True)

    def _report(self, result: Status, status: str, why: str | None = None) -> None:
        line = f"run {self.id} ({self.name}): {result.line()}"
        if why is not None:
            line = f"run {self.id} ({self.name}): {why}; {result.line()}"
        sender = self._sender
        gone = sender is not None and sender.state.gone
        needs_sync = not gone and (
            self.mode == "offline"
            or result.spooled > 0
            or (sender is not None and not sender.final_sent)
        )
        if gone:
            line += ". The server deleted the run: nothing of it is kept for sync"
        repeated = self._resume.sentence() if self._resume is not None else None
        if repeated is not None:
            line += f". {repeated}"
        unsaved = self._spool.meta_problem if self._spool is not None else None
        if needs_sync and unsaved is not None:
            where = "Nothing of it is in the spool: its run.json could not be written"
            line += f". {where} ({unsaved})"
        elif needs_sync and result.spool_dir:
            root = os.path.dirname(result.spool_dir)
            url = redact_url(self.settings.url)
            where = "Offline run" if self.mode == "offline" else f"Not all data reached {url}"
            if sender is not None and sender.not_noisescope:  # not there: say where, if known
                url = server_url_for(url) or "<SERVER URL>"
                samples = f"its {result.spooled} samples" if result.spooled else "no samples"
                where = f"The spool keeps the run, with {samples}"
            command = f"noisescope sync {root} --url {url}"
            refused = sender is not None and sender.refused_status in (401, 403)
            if refused or self.settings.token:
                command += " --token <TOKEN>"
            if refused:
                where = f"{redact_url(self.settings.url)} refused the token"
            unrecorded = sender.end_unrecorded if sender is not None else None
            if unrecorded is not None:
                command += f" --run {self.id} --end {status}"
                where += f"; its end ({status}) could not be recorded in the spool ({unrecorded})"
            line += f". {where}; send it with: {command}"
        if self.page_url is not None:
            line += f". View it at {self.page_url}"
        logger.info("noisescope: %s", line)
        if not self.settings.quiet:
            print(f"noisescope: {line}", file=sys.stderr, flush=True)

    def __enter__(self) -> Run:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.finish("failed" if exc_type is not None else "finished")

    def __repr__(self) -> str:
        return f"<noisescope.Run {self.id} {self.project}/{self.task}/{self.name} {self.mode}>"

    def _forget_after_fork(self) -> None:
        """In a forked child (DataLoader worker): no sender thread exists; record nothing."""
        self._lock = threading.Lock()
        self._commit_records = _keep_nothing
        self._open = {}
        self.active = False
        self.finished = True
        self._sender = None
        self._spool = None


def init(
    url: str | None = None,
    *,
    project: str = "default",
    task: str = "default",
    name: str | None = None,
    config: dict[str, Any] | None = None,
    tags: list[str] | None = None,
    batch_size: float | None = None,
    units: str = "examples",
    run_id: str | None = None,
    token: str | None = None,
    mode: str | None = None,
    dir: str | os.PathLike[str] | None = None,
    flush_timeout: float | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    all_ranks: bool | None = None,
    quiet: bool | None = None,
    dashboard_url: str | None = None,
    transport: Transport | None = None,
    parent_run_id: str | None = None,
    branch_step: int | None = None,
    resume: bool | str = False,
    **settings: Any,
) -> Run:
    """Start a run; explicit arguments override ``NOISESCOPE_URL/TOKEN/MODE/DIR`` and friends.

    ``units`` says what ``b_small``/``b_big``/``examples`` count ("examples" or "tokens").
    Extra keyword arguments set advanced ``Settings`` fields (``batch_max``, ``memory_max``,
    ``spool_max_bytes``, ``backoff_base``, ...). ``run_id`` defaults to a fresh uuid4 hex
    (``NOISESCOPE_RUN_ID`` lets all ranks of a job share one when ``all_ranks=True``).
    ``dashboard_url`` (``NOISESCOPE_DASHBOARD_URL``) is the dashboard's base URL: the run's link
    is printed at once; without it the link comes from the server, if it knows its dashboard.
    ``parent_run_id`` and ``branch_step`` make this run a branch of another one, started from
    that run's state at that step (``noisescope.branch`` sets them). ``resume`` (True,
    "allow" or "must", with ``run_id``) continues that run (docs/client.md, "Resuming a run").
    """
    resolved = resolve(
        url=url,
        token=token,
        mode=mode,
        dir=dir,
        flush_timeout=flush_timeout,
        rank=rank,
        world_size=world_size,
        all_ranks=all_ranks,
        quiet=quiet,
        dashboard_url=dashboard_url,
        **settings,
    )
    return Run(
        resolved,
        project=project,
        task=task,
        name=name,
        config=config,
        tags=tags,
        batch_size=batch_size,
        units=units,
        run_id=(os.environ.get("NOISESCOPE_RUN_ID") or None) if run_id is None else run_id,
        transport=transport,
        parent_run_id=parent_run_id,
        branch_step=branch_step,
        resume=resume,
    )
