"""B_simple now from the run's trend in the training loss: what "B_simple now" states when the
trailing window alone cannot pin it (docs/science.md, "The current B_simple")."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ._intervals import Interval
from ._stats import student_t_quantile

# |G|² and tr(Σ) fall with the training loss, not with the step: a run at a high rate reaches
# a loss in fewer steps, a plateau holds all three still. Over a trailing window of the run,
# cut into blocks of consecutive samples (block j: n_j samples, mean training loss ℓ_j, sums
# Y_j of the two-batch estimates), each of |𝒢|² and 𝒮 is a power of the loss,
#
#     E Y_j = n_j c (ℓ_j / ℓ_now)^a,        ℓ_now: the mean loss over the run's last 10%,
#
# fitted by the estimating equations Σ_j (Y_j − n_j c e^{a x_j})(1, x_j) = 0, x_j = log(ℓ_j /
# ℓ_now) (no logs of the samples, which can be negative), so c is the level at the loss of the
# last 10% and B_simple now = c_𝒮 / c_|𝒢|². The interval is Student t on log B_simple now from
# the delete-one-block jackknife. The window starts at the run's trailing quarter and grows to
# a half, three quarters, all of it while its interval is wider than ``max_factor`` end to
# end, and only while the wider window's answer agrees with the narrower one's (the jackknife
# of their difference at ``TREND_AGREE_LEVEL``): older blocks that pull the answer away show
# that the power law does not reach back that far, and the narrower window's answer stands.
# Without a fit over the trailing quarter (a block there whose |𝒢|² sums to zero or below)
# there is no answer: a wider window would carry the older blocks' trend over the gap.

#: Blocks the whole run is cut into (fewer, of at least ``min_block`` samples, for a short run).
TREND_BLOCKS = 40
#: The trailing shares of the run the trend's window may take, in the order it grows.
TREND_FRACTIONS = (0.25, 0.5, 0.75, 1.0)
#: Confidence at which a wider window's answer differs from the narrower one's (it stops).
#: Chosen on the exact-truth study's seed-0 runs only (docs/reproduction.md): 80% rather than
#: the step model's 90% stops more windows that reach into a trend of their own.
TREND_AGREE_LEVEL = 0.8

#: A run in blocks, oldest first: sample counts, sums of |𝒢|² and 𝒮, counts of samples with a
#: training loss and the sums of their losses.
RunBlocks = tuple[
    Sequence[float], Sequence[float], Sequence[float], Sequence[float], Sequence[float]
]


@dataclass(frozen=True)
class LossTrend:
    """B_simple now from the loss trend: the ``level`` interval of each quantity at the loss of
    the run's last 10%, and the trailing samples the fit took."""

    n: float
    n_blocks: int
    g_sq: Interval
    trace_sigma: Interval
    b_simple: Interval


def power_tilt(block_n: Sequence[float], x: Sequence[float], target: float) -> float | None:
    """The exponent a with Σ n_k x_k e^{a x_k} / Σ n_k e^{a x_k} = target, or None when target
    is outside the x_k. The tilted mean increases with a (its derivative is the tilted
    variance), so Newton's steps from a = 0, kept inside a bracket that bisection narrows
    whenever a step would leave it, converge in a few iterations."""
    if not min(x) < target < max(x):
        return None

    def moments(a: float) -> tuple[float, float]:
        top = max(a * xk for xk in x)
        w = [n * math.exp(a * xk - top) for n, xk in zip(block_n, x, strict=True)]
        total = sum(w)
        mean = sum(wk * xk for wk, xk in zip(w, x, strict=True)) / total
        return mean, sum(wk * (xk - mean) ** 2 for wk, xk in zip(w, x, strict=True)) / total

    lo, hi = -math.inf, math.inf
    a = 0.0
    for _ in range(200):
        mean, var = moments(a)
        if abs(mean - target) <= 1e-12 * (max(x) - min(x)):
            return a
        lo, hi = (a, hi) if mean < target else (lo, a)
        step = a - (mean - target) / var if var > 0 else math.nan
        if lo < step < hi:
            a = step
        elif math.isfinite(lo) and math.isfinite(hi):
            a = 0.5 * (lo + hi)
        else:
            a = 2.0 * a + (1.0 if mean < target else -1.0)
    return a


def power_fit(
    n: Sequence[float], x: Sequence[float], y: Sequence[float]
) -> tuple[float, float] | None:
    """(c, a) of E y_k = n_k c e^{a x_k} fitted to block sums y by the estimating equations
    (``power_tilt``); None where there is no fit (Σy <= 0, or no exponent)."""
    total = sum(y)
    if total <= 0:
        return None
    a = power_tilt(n, x, sum(yk * xk for yk, xk in zip(y, x, strict=True)) / total)
    if a is None:
        return None
    return total / sum(nk * math.exp(a * xk) for nk, xk in zip(n, x, strict=True)), a


def power_level(n: Sequence[float], x: Sequence[float], y: Sequence[float]) -> float | None:
    """The level c at x = 0 of ``power_fit`` (None: no fit)."""
    fit = power_fit(n, x, y)
    return None if fit is None else fit[0]


def jackknife_se(values: Sequence[float]) -> float:
    """The delete-one jackknife's standard error from the leave-one-out values."""
    m = len(values)
    mean = sum(values) / m
    return math.sqrt((m - 1) / m * sum((v - mean) ** 2 for v in values))


#: A trend block: (samples, log(ℓ_j / ℓ_now), Σ|𝒢|², Σ𝒮).
_Block = tuple[float, float, float, float]


def _logs(blocks: Sequence[_Block]) -> tuple[float, float] | None:
    """log |G|² now and log tr(Σ) now over these blocks (None: no fit)."""
    n, x = [b[0] for b in blocks], [b[1] for b in blocks]
    g_now = power_level(n, x, [b[2] for b in blocks])
    s_now = power_level(n, x, [b[3] for b in blocks])
    if g_now is None or s_now is None or g_now <= 0 or s_now <= 0:
        return None
    return math.log(g_now), math.log(s_now)


def _jackknife(blocks: Sequence[_Block]) -> tuple[tuple[float, float], list[tuple[float, float]]]:
    """The fit over these blocks and with each block left out; raises ValueError without one."""
    point = _logs(blocks)
    leave = [_logs([*blocks[:k], *blocks[k + 1 :]]) for k in range(len(blocks))]
    if point is None or any(v is None for v in leave):
        raise ValueError("no fit")
    return point, [v for v in leave if v is not None]


def _trend_blocks(run: RunBlocks, n_blocks: int, min_block: int) -> list[_Block] | None:
    """The run regrouped into at most ``n_blocks`` consecutive blocks of nearly equal sample
    counts (a source block joins the group its first sample falls in), each with its mean
    loss relative to the last 10%'s; None where a group or the last 10% has no positive loss."""
    block_n, sum_g, sum_s, n_loss, sum_loss = run
    total = float(sum(block_n))
    m = max(1, min(n_blocks, int(total // min_block)))
    # the last 10% of samples (whole source blocks, from the end) give the loss now
    k, held, now_n, now_sum = len(block_n), 0.0, 0.0, 0.0
    while k > 0 and held < math.ceil(0.1 * total):
        k -= 1
        held += block_n[k]
        now_n += n_loss[k]
        now_sum += sum_loss[k]
    if now_n <= 0 or now_sum <= 0:
        return None
    loss_now = now_sum / now_n
    groups = [[0.0] * 5 for _ in range(m)]
    start = 0.0
    for row in zip(block_n, sum_g, sum_s, n_loss, sum_loss, strict=True):
        j = min(m - 1, int(start * m // total)) if total > 0 else 0
        while j + 1 < m and total * (j + 1) // m <= start:
            j += 1
        for i, v in enumerate(row):
            groups[j][i] += v
        start += row[0]
    out = []
    for n, g, s, nl, sl in groups:
        if n <= 0:
            continue
        if nl <= 0 or sl <= 0:
            return None
        out.append((n, math.log(sl / nl / loss_now), g, s))
    return out


def loss_trend(
    run: RunBlocks,
    *,
    level: float = 0.9,
    max_factor: float,
    min_block: int,
    n_blocks: int = TREND_BLOCKS,
    fractions: Sequence[float] = TREND_FRACTIONS,
    agree_level: float = TREND_AGREE_LEVEL,
) -> LossTrend | None:
    """B_simple now from the loss trend (the model above) over the window evidence allows;
    None where the trailing quarter has no fit (a block's |𝒢|² sum at or below zero, a loss
    that does not move) or a block has no positive loss."""
    blocks = _trend_blocks(run, n_blocks, min_block)
    if blocks is None or len(blocks) < 4:
        return None
    best: tuple[tuple[float, float], list[tuple[float, float]]] | None = None
    for fraction in fractions:
        window = blocks[-max(4, round(fraction * len(blocks))) :]
        if best is not None and len(window) <= len(best[1]):
            continue
        try:
            fit = _jackknife(window)
        except ValueError:
            break  # a wider window would carry the older blocks' trend into a gap in it
        if best is not None:
            # B_simple now's change from the narrower window; a left-out block older than
            # the narrower window leaves that window's answer as it is
            extra = len(window) - len(best[1])
            old = [best[0] if k < extra else best[1][k - extra] for k in range(len(window))]
            diff = [(s - g) - (so - go) for (g, s), (go, so) in zip(fit[1], old, strict=True)]
            t = student_t_quantile(0.5 + agree_level / 2.0, len(window) - 1)
            change = (fit[0][1] - fit[0][0]) - (best[0][1] - best[0][0])
            if abs(change) > t * jackknife_se(diff):
                break
        best = fit
        t = student_t_quantile(0.5 + level / 2.0, len(window) - 1)
        if math.exp(2.0 * t * jackknife_se([s - g for g, s in fit[1]])) <= max_factor:
            break
    if best is None:
        return None
    (log_g, log_s), leave = best
    m = len(leave)
    t = student_t_quantile(0.5 + level / 2.0, m - 1)

    def interval(value: float, leave_values: Sequence[float]) -> Interval:
        half = t * jackknife_se(leave_values)
        return Interval(math.exp(value), math.exp(value - half), math.exp(value + half))

    return LossTrend(
        n=float(sum(b[0] for b in blocks[-m:])),
        n_blocks=m,
        g_sq=interval(log_g, [g for g, _ in leave]),
        trace_sigma=interval(log_s, [s for _, s in leave]),
        b_simple=interval(log_s - log_g, [s - g for g, s in leave]),
    )
