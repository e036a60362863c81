"""Step 1 of the analysis: where a run's loss curve reaches a target, on its evaluation loss or
its training loss smoothed over a centred window of steps."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

__all__ = ["LOSS_WINDOW", "crossing_step", "smooth_training_loss"]

#: The training loss at step s is its mean over steps (1 - LOSS_WINDOW) s .. (1 + LOSS_WINDOW) s
#: (0.2: on the project's quick sweeps, crossings of the smoothed training loss fall within a
#: few per cent of the evaluation loss's on average, where 0.1 crosses ~25% early on small
#: batches: the first dip of a noisy curve below a target comes early).
LOSS_WINDOW = 0.2


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


def smooth_training_loss(
    steps: Sequence[float], losses: Sequence[float], weights: Sequence[float] | None = None
) -> list[float]:
    """Each point's loss averaged (weighted) over the points within steps (1 ± LOSS_WINDOW) s:
    centred, so a falling loss is not lagged (at the ends of the run the window shrinks to stay
    symmetric about s), and of the same relative width for runs whose lengths differ by orders
    of magnitude. The first dip of a noisy curve below a target comes early, most of all for
    small batches: the window is what keeps a crossing honest."""
    if len(steps) != len(losses) or (weights is not None and len(weights) != len(steps)):
        raise ValueError("steps, losses and weights must have the same length")
    if not steps:
        return []
    w = [1.0] * len(steps) if weights is None else [float(x) for x in weights]
    prefix_w = [0.0]
    prefix_wl = [0.0]
    for wi, li in zip(w, losses, strict=True):
        prefix_w.append(prefix_w[-1] + wi)
        prefix_wl.append(prefix_wl[-1] + wi * li)
    first, last = float(steps[0]), float(steps[-1])
    out = []
    for s in steps:
        lo_step, hi_step = s * (1.0 - LOSS_WINDOW), s * (1.0 + LOSS_WINDOW)
        if hi_step > last:
            lo_step = max(lo_step, s - (last - s))
        if lo_step < first:
            hi_step = min(hi_step, s + (s - first))
        lo = bisect.bisect_left(steps, lo_step)
        hi = bisect.bisect_right(steps, hi_step)
        total = prefix_w[hi] - prefix_w[lo]
        out.append((prefix_wl[hi] - prefix_wl[lo]) / total if total > 0 else float("nan"))
    return out
