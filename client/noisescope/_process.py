"""What the process does to its live runs: finish them however it ends, forget them in a
forked child that inherited them.

- A normal exit runs ``atexit``: each live run is finished (bounded flush, the rest spooled),
  ``failed`` when an uncaught exception (Ctrl-C included) ends the process, else ``finished``.
- SIGTERM and SIGHUP (a scheduler's stop, a closed terminal) end a process without ``atexit``:
  where their handler is still the default, noisescope's finishes the runs as ``failed`` and
  then lets the signal end the process as it would have. One that arrives while ``finish()``
  waits for the server (a run in ``_finishing``) cuts that wait short: what the server has not
  taken goes to the spool, the finish line says so, then the signal ends the process. Ctrl-C
  there does the same (``Sender.close``), then raises KeyboardInterrupt.
- A ``multiprocessing`` child ends with ``os._exit`` (no ``atexit``): a run *started* in one
  is finished by a multiprocessing finalizer, which such a child runs on its way out.
- A DataLoader worker forked from the training process inherits the runs but not their sender
  threads, so it records nothing for them; the parent finishes them.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import weakref
from collections.abc import Iterator
from types import FrameType
from typing import Any, Protocol


class LiveRun(Protocol):
    """What this module asks of a live run (``noisescope.Run``, which calls it: typed here by
    what it uses, so that the process's bookkeeping needs nothing of the run's module)."""

    _pid: int

    def finish(self, status: str = ..., timeout: float | None = ...) -> object: ...
    def cut_short(self, why: str) -> None: ...
    def _say_ended(self, why: str) -> None: ...
    def _forget_after_fork(self) -> None: ...


_live_runs: weakref.WeakSet[LiveRun] = weakref.WeakSet()
#: Runs whose ``finish()`` is waiting for the server now.
_finishing: weakref.WeakSet[LiveRun] = weakref.WeakSet()
#: The process (pid) whose exit hooks are installed: a forked child installs its own.
_hooks_pid: int | None = None
#: Signals that end a process without ``atexit`` and that a job scheduler or a terminal sends.
ENDING_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)
)
#: Seconds a signal's handler waits for the server before the rest goes to the spool.
SIGNAL_FLUSH_MAX = 5.0


def track(run: LiveRun) -> None:
    """Finish ``run`` however the process ends unless it finishes first (``forget``)."""
    _live_runs.add(run)
    _install_hooks()


def forget(run: LiveRun) -> None:
    """``run`` has finished: nothing left to do for it at exit."""
    _live_runs.discard(run)


@contextlib.contextmanager
def finishing(run: LiveRun) -> Iterator[None]:
    """``run``'s ``finish()`` waits for the server meanwhile: a signal cuts it short."""
    _finishing.add(run)
    try:
        yield
    finally:
        _finishing.discard(run)


def _cut_short(why: str) -> None:
    """The runs whose ``finish()`` waits now leave the rest on disk (``Run.cut_short``), on a
    helper thread joined with a bound: the interrupted main thread may hold a lock they need."""
    runs = [run for run in list(_finishing) if run._pid == os.getpid()]
    if not runs:
        return

    def cut() -> None:
        for run in runs:
            with contextlib.suppress(Exception):
                run.cut_short(why)

    helper = threading.Thread(target=cut, name="noisescope-cut-short", daemon=True)
    helper.start()
    helper.join(SIGNAL_FLUSH_MAX)


def finish_all(status: str, timeout: float | None = None, why: str | None = None) -> None:
    """Finish every live run this process started, with ``status``; never raises."""
    for run in list(_live_runs):
        with contextlib.suppress(Exception):
            if os.getpid() == run._pid:
                if why is not None:
                    run._say_ended(why)
                run.finish(status, timeout=timeout)


def _finish_all_at_exit() -> None:
    # the interpreter sets sys.last_value when an uncaught exception (or Ctrl-C) ends it; a
    # multiprocessing child runs its finalizers while the exception is being handled
    ended_by = getattr(sys, "last_value", None) or sys.exc_info()[1]
    if ended_by is None:
        finish_all("finished")
    else:
        finish_all("failed", why=f"the process ended on {type(ended_by).__name__}")


def _on_ending_signal(signum: int, _frame: FrameType | None) -> None:
    """Finish the runs (bounded), then end the process by the signal, as the default would.

    Called by a handler installed later that chains to the one it found (Lightning's does),
    it does nothing: that handler decides how the process ends (gracefully, for Lightning),
    and ``atexit`` finishes the runs then."""
    if signal.getsignal(signum) is not _on_ending_signal:
        return
    name = signal.Signals(signum).name
    _cut_short(f"the process got {name} while finishing")
    finish_all("failed", timeout=SIGNAL_FLUSH_MAX, why=f"the process got {name}")
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _after_fork_in_child() -> None:
    for run in list(_live_runs):
        with contextlib.suppress(Exception):
            run._forget_after_fork()
    _live_runs.clear()


def _install_hooks() -> None:
    global _hooks_pid
    if _hooks_pid == os.getpid():
        return
    first = _hooks_pid is None
    _hooks_pid = os.getpid()
    if first:  # inherited by forked children, so registered once per interpreter
        atexit.register(_finish_all_at_exit)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_after_fork_in_child)
    _install_signal_handlers()
    _install_multiprocessing_finalizer()


def _install_signal_handlers() -> None:
    """Only where the handler is the default (a framework's or the user's own is kept), and
    only from the main thread (the only one that may set one)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in ENDING_SIGNALS:
        with contextlib.suppress(ValueError, OSError):
            if signal.getsignal(signum) is signal.SIG_DFL:
                signal.signal(signum, _on_ending_signal)


def _install_multiprocessing_finalizer() -> None:
    """In a ``multiprocessing`` child (its ``_bootstrap`` runs the finalizers, then
    ``os._exit``): finish this process's runs there. Not in the main process (``atexit``)."""
    mp: Any = sys.modules.get("multiprocessing")
    if mp is None or mp.parent_process() is None:
        return
    import multiprocessing.util

    multiprocessing.util.Finalize(None, _finish_all_at_exit, exitpriority=100)
