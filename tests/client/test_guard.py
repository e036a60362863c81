"""The spool guard's stop waits for a spill it has begun: ``Sender.close`` stops it and the
run's status is read right after, so a spill still running then would show its samples as in
memory (``queued``) instead of spooled (seen under load as queued=500 on a finished run)."""

from __future__ import annotations

import threading
import time
from typing import Any, cast

from noisescope._config import Settings
from noisescope._delivery._guard import Guard
from noisescope._delivery._outbox import Outbox


class SlowSpill:
    """The parts of an Outbox the guard calls; its spill takes ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.started = threading.Event()
        self.spilled = threading.Event()

    def spool_usable(self) -> bool:
        return True

    def progress(self) -> tuple[int, int]:
        return 0, 0

    def spool_inflight(self) -> None:
        pass

    def spill(self, force: bool = False) -> None:
        self.started.set()
        time.sleep(self.seconds)
        self.spilled.set()

    def spill_events(self, final: bool = False) -> None:
        pass

    def _report(self, message: str, key: str) -> None:
        raise AssertionError(message)


def test_stop_returns_after_the_spill_in_progress() -> None:
    outbox = SlowSpill(0.5)
    settings = cast(Settings, type("S", (), {"batch_interval": 0.04})())
    # a request that started long ago: the guard spills at its first tick
    guard = Guard(cast(Outbox, outbox), settings, lambda: time.monotonic() - 60.0, lambda: False)
    guard.start()
    assert outbox.started.wait(5.0)
    guard.stop()
    assert outbox.spilled.is_set()


def test_stop_from_the_guard_thread_itself_does_not_wait_on_itself() -> None:
    guard_box: list[Any] = []

    class StopsItself(SlowSpill):
        def spill(self, force: bool = False) -> None:
            guard_box[0].stop()  # joining itself would raise
            super().spill(force)

    outbox = StopsItself(0.0)
    settings = cast(Settings, type("S", (), {"batch_interval": 0.04})())
    guard = Guard(cast(Outbox, outbox), settings, lambda: time.monotonic() - 60.0, lambda: False)
    guard_box.append(guard)
    guard.start()
    assert outbox.spilled.wait(5.0)
