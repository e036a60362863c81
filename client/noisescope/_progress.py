"""How far a long command is: "[12/66] 18% · 2 min left" on a terminal, nothing elsewhere.

The one progress line of every long command (``noisescope sync``, ``python -m experiments``,
``python -m benchmarks``, ``python -m reliability``): here, in the package everyone installs,
so that each can import it without the client depending on them. It writes to stderr only when
stderr is a terminal, so logs, pipes and CI output never fill with carriage returns.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["Progress", "duration", "on_terminal"]


def duration(seconds: float) -> str:
    """A time left as people say it: "40 s", "2 min", "1 h 05 min"."""
    s = max(0, math.ceil(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{round(s / 60)} min"
    hours, rest = divmod(round(s / 60), 60)
    return f"{hours} h {rest:02d} min"


def on_terminal(stream: TextIO | None = None) -> bool:
    """Whether ``stream`` (default: stderr now) is a terminal, where progress is shown."""
    stream = stream if stream is not None else sys.stderr
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class Progress:
    """``done`` of ``total`` steps and the time left, estimated from the steps timed so far.

    ``total`` may be an estimate (``approx``: shown as "~66") that the caller corrects as it
    learns more; a step counted with ``timed=False`` (a cached result, a skipped section)
    counts as done but not in the rate, so it does not make the estimate optimistic. ``live``
    is whether anything is written: by default, whether stderr (or ``stream``) is a terminal;
    ``live=False`` for a command that writes its own lines and asks only for ``status()``.
    """

    def __init__(
        self,
        total: int,
        what: str = "",
        *,
        approx: bool = False,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        every: float = 0.5,
        live: bool | None = None,
    ) -> None:
        self.total = total
        self.what = what
        self.approx = approx
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr  # stderr of now, not import
        self.live = on_terminal(self.stream) if live is None else live
        self._clock = clock
        self._every = every
        self._timed = 0
        self._timed_s = 0.0
        self._since = clock()
        self._shown = -math.inf
        self._width = 0

    def left_s(self) -> float | None:
        """Seconds left at the rate of the timed steps so far; None before the first."""
        if not self._timed:
            return None
        return self._timed_s / self._timed * max(0, self.total - self.done)

    def status(self, *, left: bool = True) -> str:
        """The count, the share and (with ``left``, once a step was timed) the time left:
        "12/66 · 18% · 2 min left"."""
        total = max(self.total, self.done)
        shown = f"{self.done}/{'~' if self.approx else ''}{total}"
        if total:
            shown += f" · {100 * self.done // total}%"
        seconds = self.left_s() if left else None
        if seconds is not None and self.done < total:
            shown += f" · {duration(seconds)} left"
        return shown

    def advance(self, n: int = 1, note: str = "", *, timed: bool = True) -> None:
        """``n`` more steps done (``timed``: they took the time since the last one)."""
        now = self._clock()
        if timed:
            self._timed += n
            self._timed_s += now - self._since
        self._since = now
        self.done += n
        self.show(note, force=self.done >= self.total)

    def show(self, note: str = "", *, force: bool = False) -> None:
        """Rewrite the line (at most every ``every`` seconds unless ``force``)."""
        now = self._clock()
        if not self.live or (not force and now - self._shown < self._every):
            return
        self._shown = now
        text = " ".join(p for p in (self.what, f"[{self.status()}]", note) if p)
        self.stream.write("\r" + text.ljust(self._width))
        self.stream.flush()
        self._width = len(text)

    def clear(self) -> None:
        """Erase the line, before other output goes to the same terminal."""
        if self.live and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0
            self._shown = -math.inf

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.clear()
