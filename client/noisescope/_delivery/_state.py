"""The sender's state and its one transition function.

Everything that decides what the sender thread does next is one immutable ``State``: where the
run's life is (``Stage``), what the server knows of the run (``Link``), until when no request
is made (an outage's ``retry_at``), whether someone waits for everything to be sent, whether
the orphaned spools were looked at, and the run's final status. It changes only through
``transition(state, signal)``; the sender applies it under one lock, so the thread, ``flush``
and ``close`` always see a whole state, never half of a change.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any


class Stage(enum.Enum):
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
    #: The server refused the run (a token, not a noisescope server), at its creation or
    #: later (a token revoked mid-run): the spool keeps it for ``noisescope sync --token``.
    REFUSED = "refused"
    #: No server (offline mode): the spool keeps the run for ``noisescope sync``.
    LOCAL = "local"
    #: The run was deleted on the server (HTTP 410): nothing more is sent or spooled for it,
    #: what is left is counted dropped, and it is never created again.
    GONE = "gone"
    #: The final status was taken: nothing more to send.
    FINISHED = "finished"


class Signal(enum.Enum):
    """What happened to the sender, the state machine's input: each is one ``transition``.
    (Not the server's ``models.Event``, nor a ``Run.log_event``.)"""

    #: ``flush()`` waits for everything to be sent.
    FLUSH = "flush"
    #: ``flush()`` returned.
    FLUSHED = "flushed"
    #: ``close(final)``: stop once everything and ``final`` are sent.
    CLOSE = "close"
    #: ``close()`` ran out of time.
    ABANDON = "abandon"
    #: The server took the run's creation.
    CREATED = "created"
    #: The server refused the run (its creation, or a later write: a revoked token) for good.
    REFUSED = "refused"
    #: The server lost the run (a 404): create it again, after ``retry_at``.
    LOST = "lost"
    #: The run was deleted on the server (a 410): for good.
    DELETED = "deleted"
    #: No answer, or a retryable one: no request before ``retry_at``.
    FAILED = "failed"
    #: A successful answer: the outage, if any, is over.
    ANSWERED = "answered"
    #: The server took the final status.
    FINAL_TAKEN = "final-taken"
    #: The spools earlier runs left behind were looked at (once per run).
    ORPHANS_DONE = "orphans-done"


@dataclass(frozen=True)
class State:
    """One whole state of the sender (see the module's docstring)."""

    stage: Stage = Stage.RUNNING
    link: Link = Link.NEW
    #: ``time.monotonic()`` before which no request is made (0: no outage).
    retry_at: float = 0.0
    #: Someone waits in ``flush()``: partial batches go now.
    flushing: bool = False
    orphans_done: bool = False
    #: The run's final status (``{"status", "ended_at"}``), from ``close()``.
    final: Mapping[str, Any] | None = None

    @property
    def stopping(self) -> bool:
        return self.stage is not Stage.RUNNING

    @property
    def urgent(self) -> bool:
        """Send what there is now, partial batches and the open step included."""
        return self.flushing or self.stage is not Stage.RUNNING

    @property
    def spools_only(self) -> bool:
        """Nothing goes to a server: every sample and event goes to the spool."""
        return self.link is Link.REFUSED or self.link is Link.LOCAL

    @property
    def gone(self) -> bool:
        """The run was deleted on the server: nothing goes anywhere any more."""
        return self.link is Link.GONE

    @property
    def final_sent(self) -> bool:
        return self.link is Link.FINISHED


def initial(has_server: bool) -> State:
    """The state a sender starts in: with a server to create the run on, or offline."""
    return State(link=Link.NEW if has_server else Link.LOCAL)


def transition(
    state: State,
    signal: Signal,
    *,
    retry_at: float = 0.0,
    final: Mapping[str, Any] | None = None,
) -> State:
    """The state after ``signal``. ``retry_at`` goes with FAILED and LOST, ``final`` with
    CLOSE. A signal that cannot happen in ``state`` (a late answer after the run was
    refused, a second close) leaves it as it is."""
    if signal is Signal.FLUSH:
        return replace(state, flushing=True)
    if signal is Signal.FLUSHED:
        return replace(state, flushing=False)
    if signal is Signal.CLOSE:
        if state.stage is not Stage.RUNNING:
            return state
        return replace(state, stage=Stage.STOPPING, final=final)
    if signal is Signal.ABANDON:
        return replace(state, stage=Stage.ABANDONED)
    if signal is Signal.CREATED:
        return replace(state, link=Link.CREATED) if state.link is Link.NEW else state
    if signal is Signal.REFUSED:
        refusable = state.link is Link.NEW or state.link is Link.CREATED
        return replace(state, link=Link.REFUSED) if refusable else state
    if signal is Signal.DELETED:
        deletable = state.link is Link.NEW or state.link is Link.CREATED
        return replace(state, link=Link.GONE, retry_at=0.0) if deletable else state
    if signal is Signal.LOST:
        if state.link is not Link.CREATED:
            return replace(state, retry_at=retry_at)
        return replace(state, link=Link.NEW, retry_at=retry_at)
    if signal is Signal.FAILED:
        return replace(state, retry_at=retry_at)
    if signal is Signal.ANSWERED:
        return replace(state, retry_at=0.0) if state.retry_at else state
    if signal is Signal.FINAL_TAKEN:
        return replace(state, link=Link.FINISHED) if state.link is Link.CREATED else state
    if signal is Signal.ORPHANS_DONE:
        return replace(state, orphans_done=True)
    raise AssertionError(f"unknown signal {signal!r}")  # pragma: no cover
