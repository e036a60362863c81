"""``noisescope._progress.Progress``: a total, a percentage and the time left on a terminal,
nothing at all elsewhere (issue 47 item 8)."""

from __future__ import annotations

import io

from noisescope._progress import Progress, duration


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_terminal_sees_the_total_the_share_and_the_time_left() -> None:
    out, clock = Terminal(), Clock()
    progress = Progress(66, "sweep", stream=out, clock=clock, every=0)
    for _ in range(12):
        clock.now += 10
        progress.advance()
    assert progress.status() == "12/66 · 18% · 9 min left"  # 54 more at 10 s each
    assert out.getvalue().endswith("\rsweep [12/66 · 18% · 9 min left]")
    progress.clear()
    assert out.getvalue().endswith("\r" + " " * len("sweep [12/66 · 18% · 9 min left]") + "\r")


def test_untimed_steps_count_as_done_but_not_in_the_rate() -> None:
    clock = Clock()
    progress = Progress(10, stream=Terminal(), clock=clock, approx=True)
    progress.advance(4, timed=False)  # cached: instant
    assert progress.status() == "4/~10 · 40%"
    clock.now += 36
    progress.advance()
    assert progress.status() == "5/~10 · 50% · 3 min left"
    progress.advance(6)  # past an estimated total: the total follows
    assert progress.status() == "11/~11 · 100%"


def test_nothing_is_written_when_stderr_is_not_a_terminal() -> None:
    out = io.StringIO()
    with Progress(3, "sync", stream=out, every=0) as progress:
        for _ in range(3):
            progress.advance(note="run")
    assert not progress.live and out.getvalue() == ""


def test_updates_are_rate_limited_but_the_last_is_shown() -> None:
    out, clock = Terminal(), Clock()
    progress = Progress(3, stream=out, clock=clock, every=5)
    progress.advance()
    progress.advance()  # within 5 s of the first: not written
    assert out.getvalue().count("\r") == 1
    progress.advance()  # the last step is always shown
    assert out.getvalue().rstrip().endswith("\r[3/3 · 100%]")


def test_durations_read_as_people_say_them() -> None:
    assert [duration(s) for s in (0.2, 59, 61, 3599, 3600, 3900)] == [
        "1 s", "59 s", "1 min", "60 min", "1 h 00 min", "1 h 05 min",
    ]  # fmt: skip
