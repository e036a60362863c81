"""The current B_simple of a run: one window rule for every page, endpoint and training loop."""

from __future__ import annotations

import itertools
import math
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from .._format import count
from ._intervals import (
    INTERVAL_BLOCKS,
    BlockMoments,
    NoiseScaleInterval,
    block_moments,
    interval_from_blocks,
)
from ._stats import student_t_quantile
from ._trend import RunBlocks, loss_trend

# --- The current B_simple of a run -------------------------------------------------------
#
# One definition of "B_simple now" (docs/science.md, "The current B_simple"), used by the
# server's pages and endpoints, ``NoiseTracker`` and ``BatchSizeScheduler`` alike. The window
# starts as the trailing ``CURRENT_FRACTION`` of a run's samples (at least
# ``CURRENT_MIN_SAMPLES``) and doubles back toward the start while its ``level`` interval is
# wider than ``CURRENT_MAX_REL_WIDTH`` times the estimate, under two limits that keep it *now*:
#
# - it never reaches back past the trailing ``CURRENT_MAX_FRACTION`` of the run;
# - it never takes in samples whose |𝒢|^2 or 𝒮 differ significantly (``CURRENT_SHIFT_LEVEL``,
#   a two-sample t test on block-jackknife means) from the window's own: the noise scale of a
#   real run grows 10-100x as the loss falls, and a ratio of sums over such a span is ruled by
#   its oldest steps, where |𝒢|^2 is largest.
#
# When the window it ends with has no interval within ``CURRENT_MAX_FACTOR`` of its value, the
# answer is what is known instead of a number borrowed from the past: the interval's lower end
# as a bound, or, with no bounded interval, a lower bound when 𝒮 is significantly positive but
# |𝒢|^2 is not (Fieller's set for B_simple >= 0 is then [bound, inf)), else "not yet
# measurable".
#
# Before settling for a bound, the rule reads the run's trend: |G|^2 and tr(Σ) as powers of the
# training loss over a trailing stretch of the run (``estimators.loss_trend``), read at the
# loss of the last 10%. Its number is the answer when its interval lies within
# ``CURRENT_MAX_FACTOR`` of it; else the window's bound stands.

#: Share of a run's samples the current window holds at least (the most recent ones).
CURRENT_FRACTION = 0.1
#: Share of a run's samples the current window holds at most (unless that is below
#: ``CURRENT_MIN_SAMPLES``).
CURRENT_MAX_FRACTION = 0.5
#: Fewest samples the current B_simple is ever computed from.
CURRENT_MIN_SAMPLES = 64
#: Fewest samples in each block the window's interval is computed from (of at most
#: ``INTERVAL_BLOCKS``): a short window is cut into fewer, longer blocks (64 samples: 8 of 8)
#: rather than 30 of two, because single samples are heavy-tailed (late in training a few
#: examples carry most of 𝒮) and a step's batch lingers in momentum or Adam for several
#: steps, while the interval assumes nearly independent, nearly normal block means.
CURRENT_MIN_BLOCK = 8
#: The window grows until (hi - lo) / B_simple of its interval is at most this.
CURRENT_MAX_REL_WIDTH = 1.0
#: A number is stated only when its interval lies within this factor of it on both sides
#: (lo >= B/1.9, hi <= 1.9 B): then the number is within 1.9x of the window's value whenever
#: the interval covers it, and within 2x of the run's last 10% while the noise scale grows by
#: up to 5% between the window and those last steps (it grows as the loss falls, and a window
#: may reach back to half the run). A wider window states its lower end as a bound instead.
#: docs/reproduction.md ("B_simple now" against its exact value) measures the choice: at 2.0,
#: 1 of 28 numbers there was 0.49x of its last 10%'s exact value (its window's interval held).
CURRENT_MAX_FACTOR = 1.9
#: Confidence at which older samples count as a different regime (and the window stops).
#: Strict, because one evaluation makes up to ~8 such tests (two quantities per doubling) and
#: a false stop costs a number; the 10-100x shifts of early training clear any level, and a
#: drift too small to detect here is left to the factor rule below.
CURRENT_SHIFT_LEVEL = 0.999
#: A window of up to this many samples is read sample by sample; a longer one in blocks of
#: ``CURRENT_BLOCK`` consecutive samples (the server's storage blocks: then at least 64 of
#: them, and the interval's 30 blocks are as fine either way).
CURRENT_RAW_LIMIT = 4096
CURRENT_BLOCK = 64

#: The trailing blocks of a run that hold at least a given number of samples (oldest first):
#: counts, sums of |𝒢|^2 and sums of 𝒮.
Trailing = Callable[[int], tuple[Sequence[float], Sequence[float], Sequence[float]]]
#: The whole run in blocks with its training loss (``RunBlocks``), or None where the caller has
#: no loss: read only when the window states no number.
WholeRun = Callable[[], RunBlocks | None]


@dataclass(frozen=True)
class CurrentNoiseScale:
    """A run's current window and what it says of B_simple.

    ``interval.b_simple`` is the number, or None with ``interval.reason``; then
    ``interval.b_simple_lower`` is a lower bound where one is known. ``limit`` says why the
    window stopped growing while its interval was still wider than asked (a change of regime,
    or the reach cap); None when it did not need to grow, or reached the run's start.
    """

    n: float
    interval: NoiseScaleInterval
    limit: str | None = None
    #: True when the number comes from the loss trend over the last ``n`` samples
    #: (``estimators.loss_trend``) rather than from the window's ratio of sums.
    trend: bool = False

    @property
    def b_simple(self) -> float | None:
        return None if self.interval.b_simple is None else self.interval.b_simple.value

    @property
    def lower_bound(self) -> float | None:
        """The lower bound on B_simple while there is no number (None otherwise)."""
        return None if self.interval.b_simple is not None else self.interval.b_simple_lower

    @property
    def point(self) -> float | None:
        """What a decision can act on: the value, else the lower bound (B_simple is at least
        that), else None."""
        return self.b_simple if self.b_simple is not None else self.lower_bound


def _interval(
    blocks: tuple[Sequence[float], Sequence[float], Sequence[float]], level: float
) -> NoiseScaleInterval:
    """The window's interval, in blocks of at least ``CURRENT_MIN_BLOCK`` samples."""
    n_blocks = max(2, min(INTERVAL_BLOCKS, int(sum(blocks[0]) // CURRENT_MIN_BLOCK)))
    return interval_from_blocks(*blocks, level=level, max_blocks=n_blocks)


def _narrow(interval: NoiseScaleInterval) -> bool:
    b_iv = interval.b_simple
    return (
        b_iv is not None
        and b_iv.value > 0
        and b_iv.hi - b_iv.lo <= CURRENT_MAX_REL_WIDTH * b_iv.value
    )


def _split(
    blocks: tuple[Sequence[float], Sequence[float], Sequence[float]], newer: float
) -> tuple[list[BlockMoments], BlockMoments]:
    """Moments of a window's trailing blocks holding ``newer`` samples, and of the older blocks
    before them: all of them, and their oldest half (a change inside the older part shows in
    its oldest half first, before it is diluted by the rest)."""
    block_n, block_g, block_s = blocks
    k, held = 0, 0.0
    while k < len(block_n) and held < newer:
        k += 1
        held += block_n[-k]
    cut = len(block_n) - k
    half = cut // 2
    return (
        [
            block_moments(block_n[:cut], block_g[:cut], block_s[:cut]),
            block_moments(block_n[:half], block_g[:half], block_s[:half]),
        ],
        block_moments(block_n[cut:], block_g[cut:], block_s[cut:]),
    )


def _shift(olders: Sequence[BlockMoments], newer: BlockMoments) -> str | None:
    """Whether older samples' |𝒢|^2 or 𝒮 differ significantly from the newer ones' (a
    two-sample t test at ``CURRENT_SHIFT_LEVEL``); None when they do not, or cannot be told."""
    for older in olders:
        if older.n_blocks < 2 or newer.n_blocks < 2:
            continue
        df = min(older.n_blocks, newer.n_blocks) - 1
        t = student_t_quantile(0.5 + CURRENT_SHIFT_LEVEL / 2.0, df)
        for name, old, new, var_old, var_new in (
            ("|G|^2", older.g_sq, newer.g_sq, older.var_g_sq, newer.var_g_sq),
            ("tr(Sigma)", older.trace_sigma, newer.trace_sigma, older.var_trace_sigma,
             newer.var_trace_sigma),
        ):  # fmt: skip
            if abs(old - new) > t * math.sqrt(var_old + var_new):
                return (
                    f"{count(older.n)} older samples the window would take in have a different "
                    f"{name} ({old:.3g} against {new:.3g} in the window, "
                    f"{CURRENT_SHIFT_LEVEL:.1%} confidence): the run changed regime there, so "
                    "the window does not reach back"
                )
    return None


def _what_is_known(result: CurrentNoiseScale, level: float) -> CurrentNoiseScale:
    """A window's answer as stated: its number only when the interval lies within
    ``CURRENT_MAX_FACTOR`` of it, else the lower bound it gives, with the reason."""
    interval = result.interval
    b_iv = interval.b_simple
    n = count(result.n)
    if b_iv is not None:
        if _within_factor(b_iv.lo, b_iv.value, b_iv.hi):
            return result
        wide = (
            f"{level:.0%} interval {count(b_iv.lo)} to {count(b_iv.hi)} over the last {n} "
            f"samples: too wide to state a number within {CURRENT_MAX_FACTOR:g}×"
        )
        lower: float | None = None
        reason = f"not yet measurable: {wide}"
        if b_iv.lo > 0:
            lower = b_iv.lo
            reason = f"B_simple ≥ {count(lower)} ({wide}, so only the lower end is stated)"
        bound = replace(interval, b_simple=None, reason=reason, b_simple_lower=lower)
        return replace(result, interval=bound)
    if interval.b_simple_lower is None:
        return result
    reason = (
        f"B_simple ≥ {count(interval.b_simple_lower)} ({level:.0%} confidence): over the last "
        f"{n} samples the gradient signal |G|^2 is not significantly above the noise, so only "
        "a lower bound is known; a larger batch is likely useful"
    )
    return replace(result, interval=replace(interval, reason=reason))


def _within_factor(lo: float, value: float, hi: float) -> bool:
    """Whether an interval lies within ``CURRENT_MAX_FACTOR`` of its value on both sides."""
    return lo * CURRENT_MAX_FACTOR >= value >= hi / CURRENT_MAX_FACTOR


def _from_trend(window: CurrentNoiseScale, whole_run: WholeRun, level: float) -> CurrentNoiseScale:
    """The loss trend's number where the window states none and the trend's interval lies
    within ``CURRENT_MAX_FACTOR`` of it; else the window's answer."""
    run = whole_run()
    trend = (
        None
        if run is None
        else loss_trend(
            run, level=level, max_factor=CURRENT_MAX_FACTOR, min_block=CURRENT_MIN_BLOCK
        )
    )
    if trend is None or not _within_factor(
        trend.b_simple.lo, trend.b_simple.value, trend.b_simple.hi
    ):
        return window
    interval = NoiseScaleInterval(
        level, trend.n, trend.n_blocks, trend.g_sq, trend.trace_sigma, trend.b_simple
    )
    return CurrentNoiseScale(trend.n, interval, None, trend=True)


def current_noise_scale(
    n_total: float, trailing: Trailing, *, level: float = 0.9, whole_run: WholeRun | None = None
) -> CurrentNoiseScale:
    """The current B_simple of a run of ``n_total`` samples, by the rule above.

    ``trailing(target)`` gives the run's last blocks (counts and sums of |𝒢|^2 and 𝒮, oldest
    first) holding at least ``target`` samples, or all of them: raw samples (blocks of one),
    storage blocks or ``NoiseSamples``' blocks, whichever the caller has; fine enough (tens of
    blocks or more) for the window to be split at a doubling. ``whole_run()`` gives the run's
    blocks with their training loss for the loss trend, read only when the window states no
    number (None, or no loss: the window's answer stands).
    """
    if n_total < CURRENT_MIN_SAMPLES:
        return CurrentNoiseScale(
            0.0,
            NoiseScaleInterval.unmeasured(
                level,
                n_total,
                0,
                f"not yet measurable: {n_total:,.0f} samples so far; the current B_simple needs "
                f"at least {CURRENT_MIN_SAMPLES}",
            ),
        )
    target = max(math.ceil(CURRENT_FRACTION * n_total), CURRENT_MIN_SAMPLES)
    cap = max(math.ceil(CURRENT_MAX_FRACTION * n_total), target)
    blocks = trailing(target)
    used = float(sum(blocks[0]))
    interval = _interval(blocks, level)
    limit: str | None = None
    while not _narrow(interval) and used < n_total:
        if target >= cap:
            limit = (
                f"the window reaches back at most {CURRENT_MAX_FRACTION:.0%} of the run "
                f"({count(cap)} samples)"
            )
            break
        doubled = min(2 * target, cap)
        wider = trailing(doubled)
        limit = _shift(*_split(wider, used))
        if limit is not None:
            break
        target, blocks, used = doubled, wider, float(sum(wider[0]))
        interval = _interval(blocks, level)
    window = _what_is_known(CurrentNoiseScale(used, interval, limit), level)
    if window.b_simple is not None or whole_run is None:
        return window
    return _from_trend(window, whole_run, level)


def current_window(
    block_n: Sequence[float],
    block_sum_g_sq: Sequence[float],
    block_sum_trace_sigma: Sequence[float],
    *,
    level: float = 0.9,
) -> tuple[int, CurrentNoiseScale]:
    """``current_noise_scale`` over a run's blocks in a list (oldest first): how many trailing
    blocks the window takes (whole blocks, from the end, until their samples reach the
    window's target) and the window."""
    if not len(block_n) == len(block_sum_g_sq) == len(block_sum_trace_sigma):
        raise ValueError("block_n, block_sum_g_sq and block_sum_trace_sigma differ in length")
    taken: dict[float, int] = {}

    def trailing(target: int) -> tuple[Sequence[float], Sequence[float], Sequence[float]]:
        k, held = 0, 0.0
        while k < len(block_n) and held < target:
            k += 1
            held += block_n[-k]
        taken[held] = k
        return block_n[-k:], block_sum_g_sq[-k:], block_sum_trace_sigma[-k:]

    result = current_noise_scale(float(sum(block_n)), trailing, level=level)
    return taken.get(result.n, 0), result


class NoiseSamples:
    """A run's per-sample |𝒢|^2 and 𝒮 estimates in memory, read by the current rule.

    For a training loop (``NoiseTracker``, ``BatchSizeScheduler``): prefix sums in flat arrays
    (40 bytes a sample), so any trailing window is cut into blocks without touching the
    samples, and ``current()`` costs at most a few milliseconds at step 100 or 10^7. The
    training loss, where given, feeds the loss trend (``whole_run``).
    """

    def __init__(self) -> None:
        self._cum_g = array("d", [0.0])
        self._cum_s = array("d", [0.0])
        self._cum_loss = array("d", [0.0])
        self._cum_n_loss = array("d", [0.0])
        self._steps = array("d")

    def __len__(self) -> int:
        return len(self._steps)

    def add(self, step: float, g_sq: float, trace_sigma: float, loss: float | None = None) -> None:
        """One sample's unbiased estimates (``two_batch_estimates``) and its batch's training
        loss, if known; non-finite estimates are skipped (docs/science.md, Pitfalls), a
        non-finite loss counts as unknown."""
        if not (math.isfinite(g_sq) and math.isfinite(trace_sigma) and math.isfinite(step)):
            return
        known = loss is not None and math.isfinite(loss)
        self._cum_g.append(self._cum_g[-1] + g_sq)
        self._cum_s.append(self._cum_s[-1] + trace_sigma)
        self._cum_loss.append(self._cum_loss[-1] + (loss if known and loss is not None else 0.0))
        self._cum_n_loss.append(self._cum_n_loss[-1] + (1.0 if known else 0.0))
        self._steps.append(step)

    def trailing(self, target: int) -> tuple[list[float], list[float], list[float]]:
        """The last ``target`` samples (or all), oldest first, read as the server reads a
        stored run: up to ``CURRENT_RAW_LIMIT`` as single samples, a longer window as whole
        ``CURRENT_BLOCK``-sample blocks aligned on the sample index (the storage blocks), so a
        training loop and the server give the same window and the same interval."""
        n = len(self._steps)
        if target <= CURRENT_RAW_LIMIT:
            edges = list(range(n - min(max(target, 0), n), n + 1))
        else:
            first = n
            while first > 0 and n - first < target:
                first = ((first - 1) // CURRENT_BLOCK) * CURRENT_BLOCK
            edges = [first, *range(first - first % CURRENT_BLOCK + CURRENT_BLOCK, n, CURRENT_BLOCK)]
            edges.append(n)
        pairs = list(itertools.pairwise(edges))
        return (
            [float(b - a) for a, b in pairs],
            [self._cum_g[b] - self._cum_g[a] for a, b in pairs],
            [self._cum_s[b] - self._cum_s[a] for a, b in pairs],
        )

    def whole_run(self) -> RunBlocks | None:
        """All samples in blocks with their training loss, read as the server reads a stored
        run (``trailing``: single samples up to ``CURRENT_RAW_LIMIT``, else ``CURRENT_BLOCK``-
        sample blocks aligned on the sample index); None when no sample has a loss."""
        n = len(self._steps)
        if self._cum_n_loss[-1] <= 0:
            return None
        raw = n <= CURRENT_RAW_LIMIT
        edges = list(range(n + 1)) if raw else [*range(0, n, CURRENT_BLOCK), n]
        pairs = list(itertools.pairwise(edges))
        return (
            [float(b - a) for a, b in pairs],
            [self._cum_g[b] - self._cum_g[a] for a, b in pairs],
            [self._cum_s[b] - self._cum_s[a] for a, b in pairs],
            [self._cum_n_loss[b] - self._cum_n_loss[a] for a, b in pairs],
            [self._cum_loss[b] - self._cum_loss[a] for a, b in pairs],
        )

    def current(self, level: float = 0.9) -> CurrentNoiseScale:
        """The current B_simple of these samples (``current_noise_scale``)."""
        return current_noise_scale(
            float(len(self._steps)), self.trailing, level=level, whole_run=self.whole_run
        )

    def steps(self, window: CurrentNoiseScale) -> tuple[float, float] | None:
        """The first and last step of a window ``current()`` returned (None: empty)."""
        k = int(window.n)
        if k <= 0 or k > len(self._steps):
            return None
        return self._steps[-k], self._steps[-1]

    def state(self) -> dict[str, list[float]]:
        """JSON-safe state for a checkpoint: the steps and the prefix sums themselves, so
        ``from_state`` restores them bit for bit."""
        return {
            "step": list(self._steps),
            "cum_g_sq": list(self._cum_g),
            "cum_trace_sigma": list(self._cum_s),
            "cum_loss": list(self._cum_loss),
            "cum_n_loss": list(self._cum_n_loss),
        }

    @classmethod
    def from_state(cls, state: dict[str, list[float]]) -> NoiseSamples:
        steps, cum_g, cum_s = state["step"], state["cum_g_sq"], state["cum_trace_sigma"]
        if not len(cum_g) == len(cum_s) == len(steps) + 1:
            raise ValueError("a NoiseSamples state needs one more prefix sum than steps")
        samples = cls()
        samples._steps = array("d", map(float, steps))
        samples._cum_g = array("d", map(float, cum_g))
        samples._cum_s = array("d", map(float, cum_s))
        # a state saved before the loss was kept: no sample has one
        zeros = [0.0] * len(cum_g)
        cum_loss, cum_n_loss = state.get("cum_loss", zeros), state.get("cum_n_loss", zeros)
        if not len(cum_loss) == len(cum_n_loss) == len(cum_g):
            raise ValueError("a NoiseSamples state's loss sums differ in length from its steps")
        samples._cum_loss = array("d", map(float, cum_loss))
        samples._cum_n_loss = array("d", map(float, cum_n_loss))
        return samples
