"""The current B_simple of a run: one window rule for every page and endpoint."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from ._intervals import NoiseScaleInterval, interval_from_blocks

__all__ = [
    "CURRENT_FRACTION",
    "CURRENT_MAX_REL_WIDTH",
    "CURRENT_MIN_SAMPLES",
    "current_noise_scale",
    "current_window",
]

# --- The current B_simple of a run -------------------------------------------------------
#
# One definition, used by every page and endpoint that says "B_simple now": the trailing window
# of a run's samples that holds at least ``CURRENT_FRACTION`` of them and at least
# ``CURRENT_MIN_SAMPLES``, grown (doubling, back toward the start of the run) until its
# ``level`` interval is no wider than ``CURRENT_MAX_REL_WIDTH`` times the estimate, or until it
# holds the whole run. The fraction keeps the window recent while the noise scale moves; the
# width bound keeps it long enough to say something. Below ``CURRENT_MIN_SAMPLES`` samples, or
# when even the final window's |G|^2 is not significantly positive, there is no number.

#: Share of a run's samples the current window holds at least (the most recent ones).
CURRENT_FRACTION = 0.1
#: Fewest samples the current B_simple is ever computed from.
CURRENT_MIN_SAMPLES = 64
#: The window grows until (hi - lo) / B_simple of its interval is at most this.
CURRENT_MAX_REL_WIDTH = 1.0


#: The trailing blocks of a run that hold at least a given number of samples (oldest first).
Trailing = Callable[[int], tuple[Sequence[float], Sequence[float], Sequence[float]]]


def current_noise_scale(
    n_total: float, trailing: Trailing, *, level: float = 0.9
) -> tuple[float, NoiseScaleInterval]:
    """The current B_simple of a run of ``n_total`` samples, by the rule above.

    ``trailing(target)`` gives the run's last blocks (counts and sums of |𝒢|^2 and 𝒮, oldest
    first) holding at least ``target`` samples, or all of them: raw samples (blocks of one)
    or storage blocks, whichever the caller has. Returns the samples the window holds and its
    interval (``b_simple`` None, with ``reason``, when not yet measurable).
    """
    if n_total < CURRENT_MIN_SAMPLES:
        return 0.0, NoiseScaleInterval(
            level,
            n_total,
            0,
            None,
            None,
            None,
            f"not yet measurable: {n_total:,.0f} samples so far; the current B_simple needs at "
            f"least {CURRENT_MIN_SAMPLES}",
        )
    target = max(math.ceil(CURRENT_FRACTION * n_total), CURRENT_MIN_SAMPLES)
    while True:
        block_n, block_g, block_s = trailing(target)
        interval = interval_from_blocks(block_n, block_g, block_s, level=level)
        used = float(sum(block_n))
        b_iv = interval.b_simple
        if used >= n_total or (
            b_iv is not None
            and b_iv.value > 0
            and (b_iv.hi - b_iv.lo) <= CURRENT_MAX_REL_WIDTH * b_iv.value
        ):
            return used, interval
        target *= 2


def current_window(
    block_n: Sequence[float],
    block_sum_g_sq: Sequence[float],
    block_sum_trace_sigma: Sequence[float],
    *,
    level: float = 0.9,
) -> tuple[int, NoiseScaleInterval]:
    """``current_noise_scale`` over a run's blocks in a list (oldest first): how many trailing
    blocks the window takes (whole blocks, from the end, until their samples reach the
    window's target) and its interval."""
    if not len(block_n) == len(block_sum_g_sq) == len(block_sum_trace_sigma):
        raise ValueError("block_n, block_sum_g_sq and block_sum_trace_sigma differ in length")
    taken = [0]

    def trailing(target: int) -> tuple[Sequence[float], Sequence[float], Sequence[float]]:
        k, count = 0, 0.0
        while k < len(block_n) and count < target:
            k += 1
            count += block_n[-k]
        taken[0] = k
        return block_n[-k:], block_sum_g_sq[-k:], block_sum_trace_sigma[-k:]

    _, interval = current_noise_scale(float(sum(block_n)), trailing, level=level)
    return taken[0], interval
