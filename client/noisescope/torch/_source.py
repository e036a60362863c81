"""Which source measures (``source="auto"``), and saying so once.

"auto" starts per-example on one process (micro-batches on several ranks, or where a layer
mixes the examples). It decides before it logs: a step with several backwards (gradient
accumulation) or whose per-example norms cannot be exact moves the probe to micro-batches, and
that step is not logged, so the one announcement names the source every logged row came from.
"""

from __future__ import annotations

import sys
import warnings

from torch import nn
from torch.utils.hooks import RemovableHandle

from noisescope._sink import Sink

from ._layers import unsupported_reason
from ._misuse import notice
from ._per_example import PerExampleNorms
from ._rows import NormRows
from ._sums import Micro
from ._uses import Unsupported
from ._wrappers import UnshardedHooks


class SourceDecision:
    """The source decision of ``GradientNoiseProbe`` (a mixin: the probe holds the state)."""

    world_size: int
    sink: Sink
    source: str
    source_reason: str
    step_count: int
    _auto: bool
    _announced: bool
    _fallback: str | None
    _step_dropped: bool
    _warned: set[str]
    _undecided: bool
    _micro: list[Micro]
    _micro_rows: list[Micro]
    _undecided_failure: Unsupported | None
    _per_example: PerExampleNorms | None
    _handles: list[RemovableHandle]
    _forward_handles: list[RemovableHandle]
    _unsharded: UnshardedHooks | None
    _rows: NormRows
    _read_grad: bool

    def _install(self) -> None:
        raise NotImplementedError

    def _drop_micro(self) -> None:
        """Auto decided on per-example norms: the micro-batch hooks of the first step go."""
        for h in self._handles + self._forward_handles:
            h.remove()
        self._handles.clear()
        self._forward_handles.clear()
        if self._unsharded is not None:
            self._unsharded.remove()
            self._unsharded = None
        self._rows.hook_next(False)
        self._read_grad = False

    def _fail(self, exc: BaseException) -> None:
        raise NotImplementedError

    def _auto_source(self, module: nn.Module) -> tuple[str, str]:
        """The source "auto" starts with, and why."""
        if self.world_size > 1:
            return "micro", (
                f"{self.world_size} ranks: each rank's micro-batch is a small batch, the "
                "reduced gradient the big one, at no extra compute"
            )
        if reason := unsupported_reason(module):
            return "micro", (
                f"{reason}, so per-example norms cannot be used; micro-batches need at least "
                "2 backward passes per step (gradient accumulation)"
            )
        return "per_example", (
            "one process: per-example gradient norms give B_small = 1 from each backward "
            "(switching to micro-batches if a step has several backwards)"
        )

    def _announce(self, step: int) -> None:
        """Say once which source measures, and why: a line on stderr and the run's notice."""
        if self._announced:
            return
        self._announced = True
        line = f"measuring with source={self.source!r}: {self.source_reason}"
        print(f"noisescope: {line}", file=sys.stderr, flush=True)
        notice(self.sink, step, line)

    def _cannot_per_example(self, reason: str, retry: bool) -> None:
        """This model's per-example norms cannot be computed exactly: never a wrong number.
        ``retry``: the layer moved to torch.func, only this step is lost. Otherwise auto moves
        to micro-batches (from the next step: this one is not logged); a forced per-example
        source stops measuring, saying why."""
        self._step_dropped = True
        if retry:
            self._warn_once(
                self.step_count,
                f"{reason}. This step is not logged; the layer's per-example gradients are "
                "computed with torch.func from the next step (exact, costlier)",
            )
            return
        if not self._auto:
            self._fail(Unsupported(f"{reason}; use source='micro' with gradient accumulation"))
            return
        self._fallback = reason
        self.source_reason = (
            f"{reason}, so the probe measures with micro-batches instead: that needs at least "
            "2 backward passes per step (gradient accumulation) or 2 ranks"
        )
        self._warn_once(self.step_count, self.source_reason)

    def _warn_once(self, step: int, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            warnings.warn(f"noisescope: {message}", stacklevel=4)
            notice(self.sink, step, message)

    def _decide(self, source: str) -> None:
        """Auto's first measured step told which source measures: keep its rows, drop the
        other source's hooks. Nothing was logged or announced before."""
        self._undecided = False
        rows, self._micro_rows = self._micro_rows, []
        self._undecided_failure = None
        if source == "per_example":
            self._drop_micro()
            return
        self.source = "micro"
        self.source_reason = (
            "several backward passes per step (gradient accumulation): each micro-batch is a "
            "small batch, the accumulated gradient the big one, at no extra compute"
        )
        self._micro = rows
        if self._per_example is not None:
            self._per_example.remove()
            self._per_example = None

    def _leaves_per_example(self, k: int) -> bool:
        """Auto source: whether this step (``k`` backwards) moves the probe off per-example
        norms. Such a step is not logged: its rows would come from the source it leaves."""
        return self._auto and self.source == "per_example" and (k > 1 or bool(self._fallback))

    def _maybe_switch(self, k: int) -> None:
        """Auto source: several backwards per step means accumulation, where micro-batches are
        free; and micro-batches are the fallback where per-example norms cannot be exact."""
        if not self._leaves_per_example(k):
            return
        if k > 1 and self._fallback is None:
            self.source_reason = (
                f"{k} backward passes per step (gradient accumulation): each micro-batch is a "
                "small batch, the accumulated gradient the big one, at no extra compute"
            )
        self._announced = False
        self.source = "micro"
        self._install()
