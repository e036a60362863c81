"""Steps 2 and 4 of the analysis: at one target, the fastest learning rate per batch size (the
frontier the fit goes through), and B_simple at that loss from the frontier runs' noise sums."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from noisescope.estimators import interval_from_blocks, reblock

from ._crossings import crossing_step
from ._report import FrontierPoint, SweepRun

#: B_simple "at a loss" pools the noise samples over steps s*/B_SIMPLE_WINDOW .. s* B_SIMPLE_WINDOW.
B_SIMPLE_WINDOW = 1.25

#: Blocks each run's window contributes to the interval of B_simple at a loss.
BLOCKS_PER_RUN = 8


def lr_key(run: SweepRun) -> object:
    """What groups runs into seeds at one batch size: their learning rate (6 digits), or the
    run alone when it has none."""
    return run.uid if run.lr is None else float(f"{run.lr:.6g}")


def frontier(
    runs: Sequence[SweepRun], target: float
) -> tuple[list[FrontierPoint], dict[str, float | None]]:
    """Per batch size, the learning rate that reached ``target`` in the fewest (median) steps.

    Runs sharing a batch size and learning rate are seeds: their median crossing step counts,
    a seed that never reached the target counting as infinitely slow. Also returns every run's
    own crossing step (None: not reached; 0 or less: started below the target).
    """
    crossing = {r.uid: crossing_step(r.steps, r.losses, target) for r in runs}
    groups: dict[tuple[float, object], list[SweepRun]] = {}
    for run in runs:
        groups.setdefault((run.batch_size, lr_key(run)), []).append(run)
    best: dict[float, FrontierPoint] = {}
    for (batch_size, _), group in groups.items():
        values = [crossing[r.uid] for r in group]
        median = statistics.median(math.inf if v is None else v for v in values)
        if not math.isfinite(median):
            continue
        current = best.get(batch_size)
        if current is None or median < current.steps:
            best[batch_size] = FrontierPoint(
                batch_size, group[0].lr, median, median * batch_size, [r.uid for r in group]
            )
    return [best[b] for b in sorted(best)], crossing


def b_simple_at_loss(
    runs: Sequence[SweepRun], crossings: dict[str, float | None], *, level: float = 0.9
) -> tuple[float | None, float | None, float | None, str | None]:
    """B_simple (value, lo, hi, reason) pooled over the runs' noise buckets in the step window
    [s*/B_SIMPLE_WINDOW, s* B_SIMPLE_WINDOW] around each run's own crossing s*.

    A bucket counts when its middle step lies in the window; where none does (coarse buckets),
    the bucket holding s* counts. Sums are pooled before the ratio (docs/science.md). For the
    interval each run's window is merged into at most ``BLOCKS_PER_RUN`` contiguous blocks of
    its own, so blocks never straddle two runs and the answer does not depend on their order.
    """
    block_n: list[float] = []
    block_g: list[float] = []
    block_s: list[float] = []
    for run in runs:
        s_star = crossings.get(run.uid)
        if s_star is None or not run.noise:
            continue
        lo, hi = s_star / B_SIMPLE_WINDOW, s_star * B_SIMPLE_WINDOW
        chosen = [b for b in run.noise if lo <= (b.step_lo + b.step_hi) / 2 <= hi]
        if not chosen:
            chosen = [b for b in run.noise if b.step_lo <= s_star <= b.step_hi][:1]
        n, g, s = reblock(
            [b.n for b in chosen],
            [b.sum_g_sq for b in chosen],
            [b.sum_trace_sigma for b in chosen],
            BLOCKS_PER_RUN,
        )
        block_n += n
        block_g += g
        block_s += s
    if not block_n:
        return None, None, None, "no noise samples near this loss in the frontier runs"
    interval = interval_from_blocks(block_n, block_g, block_s, level=level, max_blocks=len(block_n))
    if interval.b_simple is None:
        return None, None, None, interval.reason
    return interval.b_simple.value, interval.b_simple.lo, interval.b_simple.hi, None
