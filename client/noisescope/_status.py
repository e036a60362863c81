"""``Status``: where every sample of a run is (``Run.status()``, the line at finish)."""

from __future__ import annotations

from dataclasses import dataclass


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
    #: What went wrong last; when samples were dropped, how many and why (``dropped_account``).
    last_error: str | None
    spool_dir: str | None = None
    #: Events (``Run.log_event``, evaluations) lost: the queue and the spool were full or the
    #: server refused them (said once in the log).
    dropped_events: int = 0

    def line(self) -> str:
        text = (
            f"queued {self.queued}, sent {self.sent}, spooled {self.spooled}, "
            f"dropped {self.dropped}"
        )
        if self.dropped_events:
            text += f", dropped events {self.dropped_events}"
        if self.last_error:
            text += f"; last error: {self.last_error}"
        return text


def dropped_account(drops: list[tuple[int, str]]) -> str | None:
    """The one sentence about lost samples, from (count, why) pairs: their total (the
    ``dropped`` of the same Status) and each reason's share; None if none was lost."""
    drops = [(count, why) for count, why in drops if count]
    if not drops:
        return None
    total = sum(count for count, _ in drops)
    if len(drops) == 1:
        return f"{total} samples dropped because {drops[0][1]}"
    shares = "; ".join(f"{count} because {why}" for count, why in drops)
    return f"{total} samples dropped: {shares}"
