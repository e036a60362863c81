"""What to do with the measured noise scale: a batch-size recommendation.

Everything here reads numbers through ``noisescope.estimators`` (the maths: docs/science.md's S-E
model, Pollux's efficiency and goodput); this module only assembles them:

- ``recommend(noise, batch_size, ...)`` -> ``Recommendation``: B_simple with its interval, the
  statistical efficiency of the batch in use, S/S_min and E/E_min at the batch in use and at
  candidate batch sizes (B_crit ≈ B_simple), and, given measured throughput at a few batch
  sizes, the goodput-maximising batch.
- ``NoiseTracker``: a probe sink that forwards every sample to the run and keeps its per-step
  estimates (``estimators.NoiseSamples``), so a training job can ask for a recommendation
  locally at any step without the server, from the same current window the server uses.

The server's ``GET /api/v1/runs/{run_id}/recommendation`` builds the same object from stored
samples.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args

from noisescope import _format
from noisescope._public import report_as_public
from noisescope._results import (
    BatchOption,
    ParallelismPlan,
    ParallelismRow,
    Recommendation,
    RunSummary,
)
from noisescope._sink import Sink
from noisescope.estimators import (
    MIN_SPEEDUP,
    CurrentNoiseScale,
    NoiseSamples,
    NoiseScale,
    NoiseScaleInterval,
    check_level,
    check_non_negative,
    check_positive,
    compute_waste,
    doubling_speedup,
    examples_ratio,
    goodput_optimal_batch,
    interpolate_throughput,
    parallelism_limit,
    statistical_efficiency,
    steps_ratio,
    two_batch_estimates,
)

__all__ = [
    "BALANCE",
    "MAX_DEVICES",
    "REFERENCES",
    "BatchOption",
    "NoiseTracker",
    "Recommendation",
    "Reference",
    "bound_verdict",
    "default_candidates",
    "doubling_pays",
    "parallelism_plan",
    "recommend",
    "verdict",
]

# The answer types are defined with the others at the bottom of the client (``_results``, which
# ``noisescope.protocol`` re-exports without loading this module); shown under this module.
for _answer in (BatchOption, Recommendation):
    report_as_public(_answer, __name__)


#: The balance band: a batch within this factor of B_crit (B_crit/2 to 2 B_crit) is near the S-E
#: model's balance point B = B_crit (2x the minimum steps, 2x the minimum examples); below the
#: band doubling the batch pays in steps, above it halving it pays in examples.
BALANCE = 2.0


def verdict(
    batch_size: float,
    reference_value: float | None,
    *,
    lo: float | None = None,
    hi: float | None = None,
    level: float | None = None,
    units: str = "examples",
    reference: str = "B_simple",
) -> str:
    """The batch in use read against B_crit ≈ ``reference_value`` (docs/science.md's S-E model).

    Compares the batch with doubling or halving it through ``steps_ratio`` and
    ``examples_ratio``: "batch 256 is ~0.3× B_simple (90% interval 0.2× to 0.49×): doubling it
    would cut steps by ~38% for ~23% more examples." When the interval reaches across the
    balance point (``BALANCE``), the sentence says the advice is only a direction.
    Ratios read with two significant digits, the interval's ends with as many more as keep
    them apart (``_format.ratio_interval``).
    """
    if reference_value is None or not reference_value > 0 or not batch_size > 0:
        return f"{reference} is not yet measurable, so there is no verdict on the batch size yet."
    value = float(reference_value)
    r = batch_size / value
    head = f"batch {_format.count(batch_size)} is ~{_format.ratio(r)}× {reference}"
    # the ratio's interval: the largest ratio comes with the smallest reference value
    r_lo = batch_size / hi if hi is not None and hi > 0 else None
    r_hi = batch_size / lo if lo is not None and lo > 0 else (math.inf if lo == 0 else None)
    if r_lo is not None and r_hi is not None:
        lo_text, hi_text = _format.ratio_interval(r_lo, r_hi, head=r)
        head += (
            f" ({level:.0%} interval " if level is not None else " (interval "
        ) + f"{lo_text}× to {hi_text}×)"
    s_now = steps_ratio(batch_size, value)
    e_now = examples_ratio(batch_size, value)
    if r < 1 / BALANCE:
        s_2x = steps_ratio(2 * batch_size, value)
        e_2x = examples_ratio(2 * batch_size, value)
        text = (
            f"{head}: doubling it would cut steps by ~{(1 - s_2x / s_now) * 100:.0f}% "
            f"for ~{(e_2x / e_now - 1) * 100:.0f}% more {units}."
        )
        sure = r_hi is None or r_hi < 1 / BALANCE
    elif r > BALANCE:
        s_half = steps_ratio(batch_size / 2, value)
        e_half = examples_ratio(batch_size / 2, value)
        text = (
            f"{head}: halving it would save ~{(1 - e_half / e_now) * 100:.0f}% of the {units} "
            f"for ~{(s_half / s_now - 1) * 100:.0f}% more steps."
        )
        sure = r_lo is None or r_lo > BALANCE
    else:
        text = (
            f"{head}: near the balance point, at ~{_format.ratio(s_now)}× the minimum steps and "
            f"~{_format.ratio(e_now)}× the minimum {units}."
        )
        sure = True
    if not sure:
        text += " The interval reaches the balance point: read this as a direction, not a setting."
    return text


def bound_verdict(
    batch_size: float,
    lower: float,
    *,
    level: float | None = None,
    units: str = "examples",
) -> str:
    """The batch in use read against a lower bound only: B_simple ≥ ``lower``.

    Doubling the batch cuts steps by 1 - S(2B)/S(B) (docs/science.md's S-E model), which grows
    with B_crit, so at B_simple ≥ ``lower`` the cut is at least its value at the bound; nothing
    is said about a larger batch being wasteful, since B_simple is not resolved above it.
    """
    if not (lower > 0 and batch_size > 0):
        return verdict(batch_size, None, units=units)
    r_max = batch_size / lower
    conf = f" at {level:.0%} confidence" if level is not None else ""
    head = (
        f"batch {_format.count(batch_size)} is at most ~{_format.ratio(r_max)}× B_simple "
        f"(B_simple ≥ {_format.count(lower)}{conf})"
    )
    if r_max < 1 / BALANCE:
        s_now, s_2x = steps_ratio(batch_size, lower), steps_ratio(2 * batch_size, lower)
        return (
            f"{head}: a larger batch is likely useful; doubling it would cut steps by at least "
            f"~{(1 - s_2x / s_now) * 100:.0f}%."
        )
    return (
        f"{head}: nothing says it is too large, and whether a larger one would pay is not yet "
        "measurable (the gradient signal is below the noise)."
    )


def default_candidates(batch_size: float, b_simple: float | None) -> list[float]:
    """Powers of two from batch/8 through 8x max(batch, B_simple): where the choice lies."""
    top = max(batch_size, b_simple or 0.0) * 8.0
    lo = max(1.0, batch_size / 8.0)
    out: list[float] = []
    b = 2.0 ** math.floor(math.log2(lo))
    while b < 2.0 * top:  # up to the first power of two at or above ``top``
        out.append(b)
        b *= 2.0
    return out


def _option(
    batch_size: float,
    b_simple: float,
    reference_batch: float,
    throughput: Mapping[float, float] | None,
) -> BatchOption:
    thr: float | None = None
    if throughput:
        thr = interpolate_throughput(list(throughput), list(throughput.values()), batch_size)
    eff = statistical_efficiency(batch_size, b_simple, reference_batch)
    return BatchOption(
        batch_size=batch_size,
        steps_ratio=steps_ratio(batch_size, b_simple),
        examples_ratio=examples_ratio(batch_size, b_simple),
        efficiency=eff,
        throughput=thr,
        goodput=None if thr is None else thr * eff,
    )


def recommend(
    noise: RunSummary | CurrentNoiseScale | NoiseScaleInterval | NoiseScale | float | None,
    batch_size: float,
    *,
    candidates: Sequence[float] | None = None,
    throughput: Mapping[float, float] | None = None,
    reference_batch: float = 0.0,
    units: str = "examples",
) -> Recommendation:
    """A ``Recommendation`` from a noise-scale estimate and the batch in use.

    Args:
        noise: ``CurrentNoiseScale`` or ``NoiseScaleInterval`` (a window with its interval,
            or a lower bound), a run's ``RunSummary`` (its current window, as the server
            measured it), ``NoiseScale`` (e.g. ``EMA.value``) or a plain B_simple.
        batch_size: the batch in use, in the units of the noise samples.
        candidates: batch sizes to predict for (default: powers of two around the batch and
            B_simple).
        throughput: measured examples (tokens) per second at a few batch sizes; enables
            goodput and the goodput-maximising batch (Pollux).
        reference_batch: B0 of the efficiency (φ + B0)/(φ + B); 0 gives E_min/E.
        units: what the batch counts ("examples" or "tokens"), for the verdict's wording.
    """
    check_positive("batch_size", batch_size)
    for b in candidates or ():
        check_positive("candidates", b)
    for b, t in (throughput or {}).items():
        check_positive("throughput batch size", b)
        check_positive("throughput", t)
    check_non_negative("reference_batch", reference_batch)
    b_simple: float | None
    lo = hi = level = lower = None
    reason: str | None = None
    if isinstance(noise, CurrentNoiseScale):
        noise = noise.interval
    if isinstance(noise, NoiseScaleInterval):
        level = noise.level
        if noise.b_simple is not None:
            b_simple, lo, hi = noise.b_simple.value, noise.b_simple.lo, noise.b_simple.hi
        else:
            b_simple, reason, lower = None, noise.reason, noise.b_simple_lower
    elif isinstance(noise, RunSummary):
        level, b_simple, lo, hi = noise.level, noise.b_simple, noise.b_simple_lo, noise.b_simple_hi
        reason, lower = noise.b_simple_reason, noise.b_simple_lower
    elif isinstance(noise, NoiseScale):
        b_simple, reason = noise.b_simple, noise.reason
    elif noise is None:
        b_simple, reason = None, "not yet measurable: no noise-scale samples"
    else:
        b_simple = float(noise)
        if not (math.isfinite(b_simple) and b_simple >= 0):
            b_simple, reason = None, f"not measurable: B_simple = {noise}"
    if b_simple is not None and b_simple <= 0:
        b_simple, reason = None, "not yet measurable: B_simple is zero (no gradient noise seen)"
    if b_simple is None:
        said = (
            verdict(batch_size, None, units=units)
            if lower is None
            else bound_verdict(batch_size, lower, level=level, units=units)
        )
        return Recommendation(
            batch_size, None, lo, hi, level, reference_batch, None, (), None, None,
            reason or "not yet measurable", said, lower,
        )  # fmt: skip
    pool = set(candidates if candidates is not None else default_candidates(batch_size, b_simple))
    if throughput:
        pool |= set(throughput)
    options = tuple(_option(b, b_simple, reference_batch, throughput) for b in sorted(pool))
    best: float | None = None
    if throughput:
        best, _ = goodput_optimal_batch(
            list(throughput), list(throughput.values()), b_simple, sorted(pool), reference_batch
        )
    return Recommendation(
        batch_size=batch_size,
        b_simple=b_simple,
        b_simple_lo=lo,
        b_simple_hi=hi,
        level=level,
        reference_batch=reference_batch,
        current=_option(batch_size, b_simple, reference_batch, throughput),
        options=options,
        goodput_batch_size=best,
        critical_batch_size=b_simple,
        verdict=verdict(batch_size, b_simple, lo=lo, hi=hi, level=level, units=units),
    )


class NoiseTracker:
    """A probe sink that forwards to the run and keeps the per-step estimates for ``recommend``.

    ``probe = GradientNoiseProbe(model, NoiseTracker(run))``; then at any step
    ``tracker.recommendation(batch_size=..., throughput={...})``. Only the whole-model series
    ("") is tracked. B_simple comes from the current window, by the rule the server's pages
    use (``estimators.current_noise_scale``, docs/science.md "The current B_simple"), so the
    training job and the dashboard read the same number from the same samples.
    """

    def __init__(self, run: Sink | None = None, *, level: float = 0.9) -> None:
        check_level(level)
        self.run = run
        self.level = level
        self.samples = NoiseSamples()
        self.batch_size: float | None = None

    def log_sample(
        self, step: int, b_small: float, b_big: float, g_small_sq: float, g_big_sq: float, **kw: Any
    ) -> None:
        """``Sink.log_sample``: every keyword field goes on to the run unread; the tracker reads
        the two-batch measurement of the whole-model series."""
        if self.run is not None:
            self.run.log_sample(step, b_small, b_big, g_small_sq, g_big_sq, **kw)
        if kw.get("series", ""):
            return
        try:  # on the training thread: a bad sample is skipped, never raised
            g_sq, trace_sigma = two_batch_estimates(b_small, b_big, g_small_sq, g_big_sq)
            loss = kw.get("loss")  # for the loss trend, as the server reads it
            loss_value = None
            if isinstance(loss, int | float) and not isinstance(loss, bool):
                loss_value = float(loss)
            self.samples.add(float(step), g_sq, trace_sigma, loss_value)
        except (ValueError, TypeError, ZeroDivisionError, OverflowError):
            return
        self.batch_size = b_big

    def current(self) -> CurrentNoiseScale:
        """The current window: B_simple with its ``level`` interval, or a lower bound."""
        return self.samples.current(self.level)

    def interval(self) -> NoiseScaleInterval:
        """The current window's intervals (block jackknife + Fieller)."""
        return self.current().interval

    def recommendation(
        self,
        batch_size: float | None = None,
        *,
        candidates: Sequence[float] | None = None,
        throughput: Mapping[float, float] | None = None,
        reference_batch: float = 0.0,
    ) -> Recommendation:
        """``recommend`` on the current window."""
        batch = batch_size if batch_size is not None else self.batch_size
        if batch is None:
            raise ValueError("no batch size yet: pass batch_size= or log a sample first")
        return recommend(
            self.current(),
            batch,
            candidates=candidates,
            throughput=throughput,
            reference_batch=reference_batch,
        )


#: What a parallelism plan's critical batch size is: the sweep fit's B_crit, or a B_simple taken
#: as B_crit (docs/science.md: B_crit ≈ B_simple, which may underestimate it).
Reference = Literal["B_crit", "B_simple"]
REFERENCES: tuple[Reference, ...] = get_args(Reference)


#: The most devices a parallelism plan lists, and the largest ``max_devices`` (2^24).
MAX_DEVICES = 2**24


def doubling_pays(speedup: float | None, min_speedup: float) -> bool:
    """Whether a doubling of devices that sped training up by ``speedup`` paid: at least
    ``min_speedup``. The one rule for a plan's rows, its summary and the pages that show
    them; None (the one-device row, reached by no doubling) pays."""
    return speedup is None or speedup >= min_speedup


def _paying_devices(b_crit: float, per_device_batch: float, min_speedup: float) -> int:
    """The most devices, a power of two up to ``MAX_DEVICES``, every doubling to which paid."""
    devices = 1
    while devices < MAX_DEVICES and doubling_pays(
        doubling_speedup(devices * per_device_batch, b_crit), min_speedup
    ):
        devices *= 2
    return devices


def parallelism_plan(
    b_crit: float,
    per_device_batch: float,
    *,
    s_min: float | None = None,
    step_time: float | None = None,
    min_speedup: float = MIN_SPEEDUP,
    max_devices: int | None = None,
    units: str = "examples",
    batch_size: float | None = None,
    reference: Reference = "B_crit",
) -> ParallelismPlan:
    """How far data parallelism pays at ``b_crit`` (docs/science.md's S-E model, ideal scaling).

    One row per power-of-two device count up to ``max_devices`` (default: 4x the limit,
    at least 8): batch, S/S_min, E/E_min, the speed-up over one device and from the last
    doubling, and the share of the compute beyond the minimum. With ``s_min`` (from a sweep
    fit) the rows give absolute steps, and with ``step_time`` (seconds per step, taken as
    independent of the device count) hours as well. ``batch_size`` adds the ``verdict`` on
    that batch. ``reference`` (one of ``REFERENCES``) names what ``b_crit`` is, so the
    sentences say "B_crit" for a sweep fit and "B_simple" for a B_simple used in its place.
    """
    if reference not in REFERENCES:
        raise ValueError(f"reference must be one of {', '.join(REFERENCES)}, got {reference!r}")
    check_positive("b_crit", b_crit)
    check_positive("per_device_batch", per_device_batch)
    for name, opt in (("s_min", s_min), ("step_time", step_time), ("batch_size", batch_size)):
        if opt is not None:
            check_positive(name, opt)
    limit = parallelism_limit(b_crit, per_device_batch, min_speedup)  # inf past the floats
    beyond = not limit < MAX_DEVICES
    if max_devices is None:  # 4x the limit, at least 8, at most MAX_DEVICES: never refused
        wanted = 4.0 * limit
        max_devices = (
            MAX_DEVICES
            if wanted >= MAX_DEVICES
            else max(8, 2 ** math.ceil(math.log2(max(wanted, 1.0))))
        )
    if not 1 <= max_devices <= MAX_DEVICES:
        raise ValueError(f"max_devices must be between 1 and {MAX_DEVICES}, got {max_devices}")
    rows = []
    devices = 1
    s_one = steps_ratio(per_device_batch, b_crit)
    while devices <= max_devices:
        batch = devices * per_device_batch
        s_ratio = steps_ratio(batch, b_crit)
        steps = None if s_min is None else s_min * s_ratio
        # from the previous row's batch, as _paying_devices computes it (never batch / 2,
        # which differs once the batch overflows)
        doubling = (
            None if devices == 1 else doubling_speedup(devices // 2 * per_device_batch, b_crit)
        )
        rows.append(
            ParallelismRow(
                devices=devices,
                batch_size=batch,
                steps_ratio=s_ratio,
                examples_ratio=examples_ratio(batch, b_crit),
                speedup=s_one / s_ratio,
                doubling_speedup=doubling,
                waste=compute_waste(batch, b_crit),
                steps=steps,
                hours=None if steps is None or step_time is None else steps * step_time / 3600,
                past_limit=not doubling_pays(doubling, min_speedup),
            )
        )
        devices *= 2
    # the batch at the limit; from B_crit alone when the device count is beyond the floats
    limit_batch = (
        limit * per_device_batch
        if math.isfinite(limit)
        else parallelism_limit(b_crit, 1.0, min_speedup)
    )
    waste = compute_waste(limit_batch, b_crit)
    paying = _paying_devices(b_crit, per_device_batch, min_speedup)
    name = "B_crit" if reference == "B_crit" else "B_crit ≈ B_simple"
    basis = f"{name} = {_format.count(b_crit)}"
    if beyond:
        summary = (
            f"Each doubling of devices still speeds training up by at least {min_speedup:g}× "
            f"beyond 2^24 ({MAX_DEVICES:,}) devices at {_format.count(per_device_batch)} "
            f"{units} per device ({basis} {units}): the limit lies past what this plan lists "
            f"(~{_format.whole(limit_batch)} {units} per step)."
        )
    elif limit < 1:
        summary = (
            f"Even one device at {_format.count(per_device_batch)} {units} per step is past the "
            f"point where doubling pays {min_speedup:g}×: {basis} {units}, so a smaller batch per "
            "device would waste less compute."
        )
    else:
        # read at the plan's own rows: the last one whose doubling paid, as the table shows it
        at = paying * per_device_batch
        summary = (
            f"Past {paying:,} {'device' if paying == 1 else 'devices'} "
            f"({_format.count(at)} {units} per step) each doubling of devices speeds training up "
            f"by less than {min_speedup:g}×, and {compute_waste(at, b_crit):.0%} of the compute "
            f"there already goes beyond the minimum ({basis} {units})."
        )
    return ParallelismPlan(
        b_crit=b_crit,
        per_device_batch=per_device_batch,
        min_speedup=min_speedup,
        device_limit=limit,
        limit_batch_size=limit_batch,
        limit_waste=waste,
        paying_devices=paying,
        s_min=s_min,
        step_time=step_time,
        rows=rows,
        summary=summary,
        batch_size=batch_size,
        verdict=None
        if batch_size is None
        else verdict(batch_size, b_crit, units=units, reference=reference),
        reference=reference,
    )
