"""Step 1 of the analysis: where a run's loss curve reaches a target, on its evaluation loss or
its training loss smoothed over a centred window of steps (``estimators.smooth_training_loss``,
the smoother's one definition)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def crossing_step(steps: Sequence[float], losses: Sequence[float], target: float) -> float | None:
    """First step where ``losses`` reaches ``target`` (≤), interpolated linearly; None if never.

    A curve that starts at or below the target gives its first step (there is nothing to
    interpolate from); ``losses`` should already be smooth.
    """
    if len(steps) != len(losses):
        raise ValueError("steps and losses must have the same length")
    prev_s: float | None = None
    prev_l: float | None = None
    for s, loss in zip(steps, losses, strict=True):
        if math.isfinite(loss) and loss <= target:
            if prev_s is None or prev_l is None or not math.isfinite(prev_l) or prev_l == loss:
                return float(s)
            frac = (prev_l - target) / (prev_l - loss)
            return float(prev_s + frac * (s - prev_s))
        prev_s, prev_l = float(s), float(loss)
    return None
