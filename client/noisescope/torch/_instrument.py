"""Profiling the probes: a public hook that wraps each of their entry points.

``with noisescope.torch.instrumented(wrap): probe = GradientNoiseProbe(...)`` makes that probe
(and everything it installs later) call ``wrap(fn, is_hook)`` once per entry point and use
what it returns: ``micro_step``, ``step``, ``flush``, the forward hooks, and the gradient hooks
(``is_hook=True``: the per-parameter hooks and the per-example layers' backward). The
benchmarks meter the CPU time spent inside the probe this way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
Wrap = Callable[[Callable[..., Any], bool], Callable[..., Any]]


def _identity(fn: Callable[..., Any], is_hook: bool) -> Callable[..., Any]:
    return fn


_current: list[Wrap] = [_identity]


@contextmanager
def instrumented(wrap: Wrap) -> Iterator[None]:
    """Probes created inside the block wrap their entry points with ``wrap(fn, is_hook)``."""
    previous = _current[0]
    _current[0] = wrap
    try:
        yield
    finally:
        _current[0] = previous


def current() -> Wrap:
    """The wrapper a probe created now keeps (the identity outside ``instrumented``)."""
    return _current[0]
