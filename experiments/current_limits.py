"""What a trend over the run could add to "B_simple now" (issue 58), measured on the exact-truth
study's traces (``experiments.current_truth``).

A trend model of |G|² and tr(Σ) along the run can at best know their smooth shapes and measure
only their scale. Taking the exact values (the study has them at every step or every few),
averaged over ``SHAPE_SMOOTHING`` of the run about each step, as the shapes: |G|² now is
Σ|𝒢|² / Σ(|G|²_i / |G|²_now) over a trailing window, tr(Σ) now likewise, and B_simple now their
ratio, with Fieller's interval from the blocks' residuals about the shapes. That is the most a
model of the trend over the same window could state (short of weighing the samples
otherwise); ``line_model`` and ``power_model`` are two real ones, measured beside it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from noisescope.estimators import (
    CURRENT_MAX_FACTOR,
    CURRENT_MIN_BLOCK,
    CURRENT_MIN_SAMPLES,
    Interval,
    NoiseSamples,
    fieller,
    jackknife_se,
    power_level,
    power_tilt,
    reblock,
    student_t_quantile,
)

__all__ = [
    "LIMIT_FRACTIONS",
    "MODEL_FRACTIONS",
    "MODEL_WINDOWS",
    "SHAPE_SMOOTHING",
    "ModelAnswer",
    "TrendLimit",
    "exact_at",
    "exact_ratio",
    "line_model",
    "power_model",
    "step_model",
    "trend_limits",
    "trend_models",
]

#: The trailing shares of a run a trend could be fitted over: the current rule's longest
#: window (half the run), three quarters of it, and the whole run.
LIMIT_FRACTIONS = (0.5, 0.75, 1.0)
#: The exact values are smoothed over this share of the run on each side of a step: the trend
#: is what a model can know, not each step's own value (it jitters by 2-10x from step to step
#: under SGD with momentum at a high rate).
SHAPE_SMOOTHING = 0.05
#: Blocks a window is cut into for an interval (at least ``CURRENT_MIN_BLOCK`` samples each).
MODEL_BLOCKS = 30


@dataclass(frozen=True)
class TrendLimit:
    """What "B_simple now" a trend over a run's trailing ``fraction`` gives with the exact
    trend known (90%)."""

    fraction: float
    samples: int
    #: None: the scale of |G|² is not significantly positive
    interval: Interval | None

    @property
    def states_number(self) -> bool:
        """Whether the interval lies within ``CURRENT_MAX_FACTOR`` of its value (the rule's
        test for stating a number rather than a bound)."""
        iv = self.interval
        factor = CURRENT_MAX_FACTOR
        return iv is not None and iv.lo * factor >= iv.value >= iv.hi / factor


def exact_ratio(
    truth: Sequence[tuple[float, float, float]], first: float, last: float
) -> float | None:
    """Exact B_simple over steps ``first``..``last``: mean tr(Σ) / mean |G|² of the exact
    points there (what a window's ratio of sums estimates); None without a point."""
    points = [p for p in truth if first <= p[0] <= last]
    g = sum(p[1] for p in points)
    return sum(p[2] for p in points) / g if points and g > 0 else None


def exact_at(
    truth: Sequence[tuple[float, float, float]], steps: Sequence[float]
) -> list[tuple[float, float]]:
    """Exact |G|² and tr(Σ) at each step (ascending), linear between the exact points."""
    out, i = [], 0
    for step in steps:
        while i + 1 < len(truth) and truth[i + 1][0] <= step:
            i += 1
        a = truth[i]
        b = truth[min(i + 1, len(truth) - 1)]
        f = (step - a[0]) / (b[0] - a[0]) if b[0] > a[0] and step > a[0] else 0.0
        out.append((a[1] + f * (b[1] - a[1]), a[2] + f * (b[2] - a[2])))
    return out


def _smoothed(values: Sequence[tuple[float, float]], width: int) -> list[tuple[float, float]]:
    """Each value's centred running mean over ``width`` samples each side (fewer at the
    ends): the smooth trend a model could follow, without each step's own jitter."""
    cum_g, cum_s = [0.0], [0.0]
    for g, s in values:
        cum_g.append(cum_g[-1] + g)
        cum_s.append(cum_s[-1] + s)
    out = []
    for i in range(len(values)):
        a, b = max(0, i - width), min(len(values), i + width + 1)
        out.append(((cum_g[b] - cum_g[a]) / (b - a), (cum_s[b] - cum_s[a]) / (b - a)))
    return out


def _scale_moments(sums: Sequence[float], shapes: Sequence[float]) -> tuple[float, float] | None:
    """The scale Σ sums / Σ shapes and its variance from the blocks' residuals about it."""
    total = sum(shapes)
    if total <= 0:
        return None
    scale = sum(sums) / total
    m = len(sums)
    residual = sum((x - scale * w) ** 2 for x, w in zip(sums, shapes, strict=True))
    return scale, residual * m / (m - 1) / total**2


def trend_limits(
    samples: Sequence[tuple[float, float, float]],
    truth: Sequence[tuple[float, float, float]],
    now_from: float,
    fractions: Sequence[float] = LIMIT_FRACTIONS,
    level: float = 0.9,
) -> list[TrendLimit]:
    """``TrendLimit`` of a run's (step, |𝒢|², 𝒮) samples for each trailing fraction; "now" is
    the exact points from step ``now_from`` on (the study's: its last 10% of steps)."""
    recent = [p for p in truth if p[0] >= now_from] or list(truth[-1:])
    g_now = sum(p[1] for p in recent) / len(recent)
    s_now = sum(p[2] for p in recent) / len(recent)
    n = len(samples)
    out = []
    for fraction in fractions:
        k = min(n, max(CURRENT_MIN_SAMPLES, math.ceil(fraction * n)))
        window = samples[n - k :]
        exact = _smoothed(exact_at(truth, [p[0] for p in window]), round(SHAPE_SMOOTHING * n))
        m = max(2, min(MODEL_BLOCKS, k // CURRENT_MIN_BLOCK))
        edges = [k * j // m for j in range(m + 1)]
        parts = list(itertools.pairwise(edges))
        g_sums = [sum(p[1] for p in window[a:b]) for a, b in parts]
        s_sums = [sum(p[2] for p in window[a:b]) for a, b in parts]
        g_shapes = [sum(e[0] for e in exact[a:b]) / g_now for a, b in parts]
        s_shapes = [sum(e[1] for e in exact[a:b]) / s_now for a, b in parts]
        g = _scale_moments(g_sums, g_shapes)
        s = _scale_moments(s_sums, s_shapes)
        interval = None
        # below the rule's fewest samples nothing is stated, trend or not
        if g is not None and s is not None and n >= CURRENT_MIN_SAMPLES and g[0] > 0:
            # the two scales' residuals, block by block, for their covariance
            g_scale, s_scale = g[0], s[0]
            cov = (
                sum(
                    (gx - g_scale * gw) * (sx - s_scale * sw)
                    for gx, gw, sx, sw in zip(g_sums, g_shapes, s_sums, s_shapes, strict=True)
                )
                * m
                / (m - 1)
                / (sum(g_shapes) * sum(s_shapes))
            )
            lo, hi = fieller(s_scale, g_scale, s[1], g[1], cov, level, m - 1)
            if lo is not None and hi is not None:
                interval = Interval(s_scale / g_scale, lo, hi)
        out.append(TrendLimit(fraction, k, interval))
    return out


# --- trend models tried (issue 58) ---------------------------------------------------------
#
# Two models of the trend, each read at the run's last sample, with the rule's 90% interval
# test (a number when the interval lies within ``CURRENT_MAX_FACTOR`` of it):
#
# - ``line``: B_simple a straight line in the sample index over the trailing half,
#   Σ_k w_k (𝒮_k − (b0 + b1 u_k) |𝒢|²_k) = 0 for w = 1, u (u = 0 at the last sample; a ratio of
#   sums when b1 = 0), so b0 = Σ c_k 𝒮_k / Σ c_k |𝒢|²_k with c_k = Σ u²|𝒢|² − u_k Σ u|𝒢|²;
#   a Student-t interval from the fit's own error (its sandwich variance over the blocks).
# - ``power``: |G|² a power of tr(Σ) over the trailing 80%, E|𝒢|²_k = n_k c (𝒮̄_k / 𝒮_now)^a
#   (tr(Σ) is well measured and falls with the loss; the exponent from the estimating
#   equations Σ_k (|𝒢|²_k − n_k c x_k^a) (1, log x_k) = 0), tr(Σ) now over the last eighth of the
#   blocks;
#   a Student-t interval on log B_simple from the block jackknife.
# - ``step``: |G|² and tr(Σ) each a power of the step (``step_model``), over a trailing window
#   chosen by evidence.
# - ``loss``: |G|² and tr(Σ) each a power of the training loss, window chosen likewise
#   (``experiments.current_loss``).

#: The trailing share of a run each trend model is fitted over (``step``: at most; its window
#: is chosen by evidence, ``STEP_FRACTIONS``).
MODEL_FRACTIONS = {"line": 0.5, "power": 0.8, "step": 1.0, "loss": 1.0}
#: Each trend model's window, in words (the study's table).
MODEL_WINDOWS = {
    "line": "the last 50%",
    "power": "the last 80%",
    "step": "the last 25%, 50%, 75% or all of the run, as the evidence allows",
    "loss": "the last 25%, 50%, 75% or all of the run, as the evidence allows",
}

Blocks = tuple[list[float], list[float], list[float]]


def _centres(block_n: Sequence[float], n_total: float) -> list[float]:
    """Each block's middle sample, as a share of the run before its last sample (<= 0)."""
    out, start = [], n_total - sum(block_n)
    for n in block_n:
        out.append((start + n / 2.0 - n_total) / n_total)
        start += n
    return out


def line_model(blocks: Blocks, n_total: float, level: float = 0.9) -> Interval | None:
    """B_simple at the last sample under the line model, with the fit's own error: the
    sandwich variance of b0 from the blocks' residuals 𝒮_k − (b0 + b1 u_k) |𝒢|²_k, whose
    influence on b0 is c_k / Σ c|𝒢|², and a Student-t interval on m - 2 degrees of freedom.
    None where the fit has no positive denominator, or its interval reaches 0."""
    _, g, s = blocks
    m = len(g)
    if m < 4:
        return None
    u = _centres(blocks[0], n_total)
    a = sum(gk * uk * uk for gk, uk in zip(g, u, strict=True))
    b = sum(gk * uk for gk, uk in zip(g, u, strict=True))
    c = [a - uk * b for uk in u]
    den = sum(ck * gk for ck, gk in zip(c, g, strict=True))
    if den <= 0:
        return None
    b0 = sum(ck * sk for ck, sk in zip(c, s, strict=True)) / den
    b1 = (sum(s) - b0 * sum(g)) / b if b else 0.0
    influence = [
        ck * (sk - (b0 + b1 * uk) * gk) / den for ck, sk, gk, uk in zip(c, s, g, u, strict=True)
    ]
    se = math.sqrt(sum(x * x for x in influence) * m / (m - 2))
    t = student_t_quantile(0.5 + level / 2.0, m - 2)
    if b0 - t * se <= 0:
        return None
    return Interval(b0, b0 - t * se, b0 + t * se)


def _power_log_b(blocks: Blocks) -> float | None:
    """log B_simple now under the power model, or None where it has no fit."""
    n, g, s = blocks
    recent = max(1, len(n) // 8)
    s_now = sum(s[-recent:]) / sum(n[-recent:])
    g_total = sum(g)
    if s_now <= 0 or g_total <= 0 or min(s) <= 0:
        return None
    x = [math.log(sk / nk / s_now) for nk, sk in zip(n, s, strict=True)]
    a = power_tilt(n, x, sum(gk * xk for gk, xk in zip(g, x, strict=True)) / g_total)
    if a is None:
        return None
    log_g_now = math.log(g_total) - math.log(
        sum(nk * math.exp(a * xk) for nk, xk in zip(n, x, strict=True))
    )
    return math.log(s_now) - log_g_now


def power_model(blocks: Blocks, level: float = 0.9) -> Interval | None:
    """B_simple now under the power model, with the jackknife's t interval on its log."""
    m = len(blocks[0])
    point = _power_log_b(blocks) if m >= 3 else None
    if point is None:
        return None
    leave = []
    for k in range(m):
        part = _power_log_b(
            (
                blocks[0][:k] + blocks[0][k + 1 :],
                blocks[1][:k] + blocks[1][k + 1 :],
                blocks[2][:k] + blocks[2][k + 1 :],
            )
        )
        if part is None:
            return None
        leave.append(part)
    mean = sum(leave) / m
    se = math.sqrt((m - 1) / m * sum((x - mean) ** 2 for x in leave))
    t = student_t_quantile(0.5 + level / 2.0, m - 1)
    return Interval(math.exp(point), math.exp(point - t * se), math.exp(point + t * se))


@dataclass(frozen=True)
class ModelAnswer:
    """What a trend model says of B_simple now: its interval, and whether it is a number."""

    model: str
    interval: Interval | None

    @property
    def states_number(self) -> bool:
        iv, factor = self.interval, CURRENT_MAX_FACTOR
        return iv is not None and iv.lo * factor >= iv.value >= iv.hi / factor


def trend_models(
    samples: Sequence[tuple[float, float, float]], losses: Sequence[float]
) -> list[ModelAnswer]:
    """Each trend model's answer on a run's (step, |𝒢|², 𝒮) samples and their batches'
    training losses (``loss``: ``experiments.current_loss``)."""
    from experiments.current_loss import loss_model  # it imports this module

    held = NoiseSamples()
    for step, g_sq, trace_sigma in samples:
        held.add(step, g_sq, trace_sigma)
    n = len(held)
    out = []
    for model, fraction in MODEL_FRACTIONS.items():
        k = min(n, max(CURRENT_MIN_SAMPLES, math.ceil(fraction * n)))
        blocks = reblock(*held.trailing(k), MODEL_BLOCKS)
        answer = None
        if n >= CURRENT_MIN_SAMPLES:
            if model == "line":
                answer = line_model(blocks, n)
            elif model == "power":
                answer = power_model(blocks)
            elif model == "loss":
                answer = loss_model(samples, losses)
            else:
                answer = step_model(samples)
        out.append(ModelAnswer(model, answer))
    return out


# --- |G|² and tr(Σ) each a power of the step -------------------------------------------------
#
# E|𝒢|²_k = |G|²_now (t_k / t_now)^a and E𝒮_k = tr(Σ)_now (t_k / t_now)^b (t = step + 1), each
# fitted on block sums by the estimating equations Σ_j (Y_j − n_j c x_j^a)(1, log x_j) = 0
# (``power_tilt``; no logs of samples, which can be negative), read at the last step. The window
# starts at the trailing quarter of the run's ``STEP_BLOCKS`` blocks and grows to a half, three
# quarters, all of it while its 90% interval is wider than ``CURRENT_MAX_FACTOR`` from end to
# end, and only while the wider window's B_simple now agrees with the narrower one's (the
# jackknife of their difference over the wider window's blocks, ``STEP_AGREE_LEVEL``): older
# steps that pull the answer away show that the power law does not reach back that far.
# The interval: Student t on log B_simple now from the block jackknife.

#: Blocks the whole run is cut into (at least ``CURRENT_MIN_BLOCK`` samples each).
STEP_BLOCKS = 40
#: The trailing shares of the run the step model's window may take, in the order it grows.
STEP_FRACTIONS = (0.25, 0.5, 0.75, 1.0)
#: Confidence at which a wider window's answer differs from the narrower one's (it stops).
STEP_AGREE_LEVEL = 0.9

#: Blocks of the step model: (samples, log(t / t_now) at the block's mean step, Σ|𝒢|², Σ𝒮).
StepBlock = tuple[float, float, float, float]


def _step_blocks(samples: Sequence[tuple[float, float, float]]) -> list[StepBlock]:
    n = len(samples)
    m = max(1, min(STEP_BLOCKS, n // CURRENT_MIN_BLOCK))
    t_now = samples[-1][0] + 1.0
    out = []
    for a, b in itertools.pairwise([n * j // m for j in range(m + 1)]):
        part = samples[a:b]
        t = sum(p[0] + 1.0 for p in part) / len(part)
        out.append((float(len(part)), math.log(t / t_now), sum(p[1] for p in part),
                    sum(p[2] for p in part)))  # fmt: skip
    return out


def _step_log_b(blocks: Sequence[StepBlock]) -> float | None:
    n, x, g, s = ([b[i] for b in blocks] for i in range(4))
    g_now, s_now = power_level(n, x, g), power_level(n, x, s)
    if g_now is None or s_now is None or g_now <= 0 or s_now <= 0:
        return None
    return math.log(s_now / g_now)


def _step_jackknife(blocks: Sequence[StepBlock]) -> tuple[float, list[float]] | None:
    """log B_simple now over these blocks, and with each block left out (None: no fit)."""
    point = _step_log_b(blocks)
    leave = [_step_log_b([*blocks[:k], *blocks[k + 1 :]]) for k in range(len(blocks))]
    if point is None or any(v is None for v in leave):
        return None
    return point, [v for v in leave if v is not None]


def step_model(
    samples: Sequence[tuple[float, float, float]], level: float = 0.9
) -> Interval | None:
    """B_simple at a run's last step under the step model, over the window evidence allows;
    None where even the trailing quarter has no fit."""
    blocks = _step_blocks(samples)
    best: tuple[float, list[float]] | None = None
    for fraction in STEP_FRACTIONS:
        window = blocks[-max(4, round(fraction * len(blocks))) :]
        fit = _step_jackknife(window) if len(window) >= 4 else None
        if fit is None:
            break
        if best is not None:
            # a left-out block older than the narrower window leaves its answer as it is
            extra = len(window) - len(best[1])
            diff = [
                v - (best[0] if k < extra else best[1][k - extra]) for k, v in enumerate(fit[1])
            ]
            t = student_t_quantile(0.5 + STEP_AGREE_LEVEL / 2.0, len(window) - 1)
            if abs(fit[0] - best[0]) > t * jackknife_se(diff):
                break
        best = fit
        t = student_t_quantile(0.5 + level / 2.0, len(window) - 1)
        if math.exp(2.0 * t * jackknife_se(fit[1])) <= CURRENT_MAX_FACTOR:
            break
    if best is None:
        return None
    point, leave = best
    half = student_t_quantile(0.5 + level / 2.0, len(leave) - 1) * jackknife_se(leave)
    return Interval(math.exp(point), math.exp(point - half), math.exp(point + half))
