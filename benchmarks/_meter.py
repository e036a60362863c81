"""CPU time spent inside noisescope's own code while a model trains: a floor on its overhead.

Shared by the probe and integration benchmarks. The with/without step-time ratio is the full
measure of an overhead, but on a shared machine the neighbours blur it by a few per cent; the
training thread's CPU time inside noisescope's functions is a direct reading they cannot blur.
It misses what happens outside those functions (autograd calling the hooks, cache effects), so
it is a floor: ``1 + in / untracked`` <= the true ratio.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any


class Meter:
    """Training-thread CPU seconds inside noisescope (outermost calls only).

    Each metered call also counts the clock reads around it; ``per_call`` (calibrated on a
    no-op) is that cost, and ``net`` takes it out, so hundreds of tiny hook calls per step are
    not overstated.
    """

    def __init__(self) -> None:
        self.total = 0.0
        self.hooks = 0.0  # of which: autograd hooks (gradient norms, per-example layers)
        self.calls = 0
        self.hook_calls = 0
        self._depth = 0
        self.per_call = 0.0
        self.per_call = self._calibrate()

    def _calibrate(self, n: int = 20_000) -> float:
        probe = Meter.__new__(Meter)
        probe.total = probe.hooks = probe.per_call = 0.0
        probe.calls = probe.hook_calls = probe._depth = 0
        noop = probe.wrap(lambda: None)
        for _ in range(n):
            noop()
        return probe.total / n

    def net(self, total: float, calls: int) -> float:
        """``total`` seconds over ``calls`` metered calls, less the meter's own clock reads."""
        return max(total - calls * self.per_call, 0.0)

    def net_total(self) -> float:
        return self.net(self.total, self.calls)

    def net_hooks(self) -> float:
        return self.net(self.hooks, self.hook_calls)

    def wrap(self, fn: Callable[..., Any], hook: bool = False) -> Callable[..., Any]:
        meter = self

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if meter._depth:
                return fn(*args, **kwargs)
            meter._depth = 1
            meter.calls += 1
            meter.hook_calls += hook
            start = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.thread_time() - start
                meter.total += spent
                if hook:
                    meter.hooks += spent
                meter._depth = 0

        return timed


@contextlib.contextmanager
def metered(meter: Meter, extra: Sequence[tuple[type, str]] = ()) -> Iterator[None]:
    """Meter the probes created inside the block (through ``noisescope.torch.instrumented``:
    their methods and every hook they install) and the ``extra`` entry points (methods of
    the framework callbacks, wrapped on their class for the block).
    """
    from noisescope.torch import instrumented

    saved = [(cls, name, cls.__dict__[name]) for cls, name in extra]
    for cls, name, fn in saved:
        setattr(cls, name, meter.wrap(fn))
    try:
        with instrumented(lambda fn, is_hook: meter.wrap(fn, hook=is_hook)):
            yield
    finally:
        for cls, name, fn in saved:
            setattr(cls, name, fn)


class NoiseGauge:
    """Times a fixed piece of work (ten 512x512 matrix products) now and then during a run.

    Its spread, (q3 - q1) / median, is printed beside each table so a reader can tell a quiet
    run from a noisy one: on a shared machine the neighbours make even identical work vary,
    and the overhead ratios with it. Call ``sample`` between the timed pieces, not inside them.
    """

    def __init__(self) -> None:
        import torch

        self._a, self._b = torch.randn(512, 512), torch.randn(512, 512)
        self.times: list[float] = []

    def sample(self, reps: int = 1) -> None:
        import torch

        for _ in range(reps):
            start = time.thread_time()
            for _ in range(10):
                torch.mm(self._a, self._b)
            self.times.append(time.thread_time() - start)

    def spread(self) -> float:
        import statistics

        q1, median, q3 = statistics.quantiles(self.times, n=4)
        return (q3 - q1) / median

    def describe(self) -> str:
        return (
            f"Machine noise during this run: the same ten 512x512 matrix products, timed "
            f"{len(self.times)} times between the measurements, varied by "
            f"{100 * self.spread():.0f}% (interquartile range over the median)."
        )
