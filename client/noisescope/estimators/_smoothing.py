"""The smoothers, as named policies over bucket sums (docs/science.md, "Two smoothers"):

- ``smooth_training_loss``: a run's training loss averaged over a *centred* window of relative
  width, ``(1 ± LOSS_WINDOW) s``; what the sweep analysis crosses loss targets on and judges
  divergence by (``training_loss_curve``);
- ``trailing_windows``: each bucket's *trailing* window of a fixed number of steps, as exact
  sums (ratio last) with the window's buckets as its interval's blocks; what a run's series
  is smoothed by (the Run page), and over ``run_fraction_window`` of each run for the
  compared series (Compare runs).

Two, because each one's job rules the other out: a centred window needs the steps after a
point, so on a live run its newest points would keep moving, and a trailing window lags a
falling loss by about half its width, which would make every crossing late.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

#: The training loss at step s is its mean over steps (1 - LOSS_WINDOW) s .. (1 + LOSS_WINDOW) s
#: (0.2: on the project's quick sweeps, crossings of the smoothed training loss fall within a
#: few per cent of the evaluation loss's on average, where 0.1 crosses ~25% early on small
#: batches: the first dip of a noisy curve below a target comes early).
LOSS_WINDOW = 0.2


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


def training_loss_curve(
    steps: Sequence[float], losses: Sequence[float], weights: Sequence[float]
) -> tuple[list[float], list[float]]:
    """A run's training loss as the sweep crosses targets on it, from its buckets' mean losses
    at their middle ``steps``, each weighted by its samples: non-finite and weightless buckets
    left out, the rest smoothed by ``smooth_training_loss``. The steps kept and their losses."""
    kept = [
        (float(s), float(x), float(w))
        for s, x, w in zip(steps, losses, weights, strict=True)
        if math.isfinite(x) and w > 0
    ]
    xs = [k[0] for k in kept]
    return xs, smooth_training_loss(xs, [k[1] for k in kept], [k[2] for k in kept])


#: A window's jackknife blocks: its buckets' sample counts, sums of |𝒢|^2 and sums of 𝒮.
Blocks = tuple[Sequence[float], Sequence[float], Sequence[float]]


@dataclass(frozen=True)
class TrailingWindows:
    """Each bucket's trailing window (``trailing_windows``), one value per bucket: its first
    bucket's index, its exact sums, its loss and learning rate, and (where asked) its buckets
    as the blocks of its interval."""

    first: list[int]
    n: list[int]
    sum_g_sq: list[float]
    sum_trace_sigma: list[float]
    loss: list[float | None]
    lr: list[float | None]
    blocks: list[Blocks] | None


def trailing_windows(
    step_hi: Sequence[float],
    window: float,
    *,
    n: Sequence[int],
    sum_g_sq: Sequence[float],
    sum_trace_sigma: Sequence[float],
    loss: Sequence[float | None],
    lr: Sequence[float | None],
    blocks: bool = True,
) -> TrailingWindows:
    """Trailing-window smoothing of consecutive buckets (last steps ``step_hi``, ascending):
    each bucket's window holds the buckets whose last steps lie within the ``window`` steps
    before its own last step (at least the bucket itself). Its |𝒢|^2 and 𝒮 are the exact sums
    of its buckets (eq. 5: ratio last, docs/science.md), its loss and learning rate the means
    of its buckets' weighted by their samples (over the buckets that have one), and with
    ``blocks`` its buckets are its interval's jackknife blocks.

    Trailing, so a point never waits for steps after it: the Run page and Compare runs draw
    live runs. Running sums keep it linear in the number of buckets whatever the window."""
    first: list[int] = []
    start = 0
    for i, last in enumerate(step_hi):
        while start < i and step_hi[start] <= last - window:
            start += 1
        first.append(start)
    ends = range(1, len(step_hi) + 1)
    n_loss = [c if v is not None else 0 for c, v in zip(n, loss, strict=True)]
    n_lr = [c if v is not None else 0 for c, v in zip(n, lr, strict=True)]

    def total(column: Sequence[float]) -> list[float]:
        running = list(accumulate(column, initial=0.0))
        return [running[hi] - running[lo] for lo, hi in zip(first, ends, strict=True)]

    # a mean times its samples: the bucket's sum over them again
    loss_sum = total([w * (v or 0.0) for w, v in zip(n_loss, loss, strict=True)])
    lr_sum = total([w * (v or 0.0) for w, v in zip(n_lr, lr, strict=True)])
    loss_w, lr_w = total(n_loss), total(n_lr)
    return TrailingWindows(
        first=first,
        n=[int(v) for v in total(n)],
        sum_g_sq=total(sum_g_sq),
        sum_trace_sigma=total(sum_trace_sigma),
        loss=[t / w if w else None for t, w in zip(loss_sum, loss_w, strict=True)],
        lr=[t / w if w else None for t, w in zip(lr_sum, lr_w, strict=True)],
        blocks=[
            (n[lo:hi], sum_g_sq[lo:hi], sum_trace_sigma[lo:hi])
            for lo, hi in zip(first, ends, strict=True)
        ]
        if blocks
        else None,
    )


def run_fraction_window(first_step: float, last_step: float, fraction: float) -> float:
    """The trailing window, in steps, that is ``fraction`` of a run's steps ``first_step`` ..
    ``last_step`` (at least one step; 0, no smoothing, for a ``fraction`` of 0): compared runs
    of different lengths are smoothed alike."""
    if not fraction > 0:
        return 0.0
    return max(1.0, fraction * (last_step - first_step + 1))
