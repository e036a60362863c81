"""The one in-process interface between measuring and recording (no torch, no I/O).

``noisescope.Run`` implements it; probes, ``NoiseTracker`` and tests' collectors write to it.
"""

from __future__ import annotations

from typing import Protocol


class Sink(Protocol):
    """Where samples go: ``noisescope.Run`` implements this; a list-collector is fine in tests."""

    # Run.log_sample's signature (its docstring says what each argument is), restated on three
    # lines: a Protocol repeats what it describes, and mypy holds the two together wherever a
    # Run is passed as a Sink.
    def log_sample(
        self, step: int, b_small: float, b_big: float, g_small_sq: float, g_big_sq: float, *,
        examples: float | None = None, series: str = "", loss: float | None = None,
        lr: float | None = None,
    ) -> None: ...  # fmt: skip
