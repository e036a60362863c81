"""The loss-trend model of "B_simple now" (issue 58; ``estimators.loss_trend``, docs/science.md
"The current B_simple") on the exact-truth study's traces: each sample's block of one, with its
batch's training loss, as the server reads a run of up to ``CURRENT_RAW_LIMIT`` samples."""

from __future__ import annotations

from collections.abc import Sequence

from noisescope.estimators import (
    CURRENT_MAX_FACTOR,
    CURRENT_MIN_BLOCK,
    TREND_AGREE_LEVEL,
    Interval,
    loss_trend,
)

__all__ = ["loss_model"]


def loss_model(
    samples: Sequence[tuple[float, float, float]],
    losses: Sequence[float],
    level: float = 0.9,
    *,
    agree_level: float = TREND_AGREE_LEVEL,
    max_factor: float = CURRENT_MAX_FACTOR,
) -> Interval | None:
    """B_simple now under the loss trend, from a run's (step, |𝒢|², 𝒮) samples and losses."""
    ones = [1.0] * len(samples)
    trend = loss_trend(
        (ones, [p[1] for p in samples], [p[2] for p in samples], ones, list(losses)),
        level=level,
        max_factor=max_factor,
        min_block=CURRENT_MIN_BLOCK,
        agree_level=agree_level,
    )
    return None if trend is None else trend.b_simple
