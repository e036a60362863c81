"""What the process does to its live runs: finish them at exit, forget them in a forked child.

A DataLoader worker forked from the training process inherits the runs but not their sender
threads, so it must record nothing; the parent finishes its runs at exit (bounded flush).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from noisescope._run import Run

_live_runs: weakref.WeakSet[Run] = weakref.WeakSet()
_hooks_installed = False


def track(run: Run) -> None:
    """Finish ``run`` at exit unless it finishes first (``forget``); installs the hooks once."""
    _live_runs.add(run)
    _install_hooks()


def forget(run: Run) -> None:
    """``run`` has finished: nothing left to do for it at exit."""
    _live_runs.discard(run)


def _finish_all_at_exit() -> None:
    for run in list(_live_runs):
        with contextlib.suppress(Exception):
            if os.getpid() == run._pid:
                run.finish()


def _after_fork_in_child() -> None:
    for run in list(_live_runs):
        with contextlib.suppress(Exception):
            run._forget_after_fork()
    _live_runs.clear()


def _install_hooks() -> None:
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    atexit.register(_finish_all_at_exit)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
