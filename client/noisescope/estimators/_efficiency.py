"""Acting on the noise scale: statistical efficiency, goodput and the learning-rate rules
(used by noisescope.schedule and noisescope.recommend)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from ._stats import check_non_negative, check_positive

# --- Acting on the noise scale: statistical efficiency, goodput, batch-size targets ----------
#
# (Used by noisescope.schedule and noisescope.recommend.) In docs/science.md's model
# (McCandlish et al. 2018, Sec. 2.2-3) reaching a loss target costs E = E_min (1 + B/B_crit)
# examples and S = S_min (1 + B_crit/B) steps. With B_crit ≈ φ (the measured noise scale,
# B_simple), the per-example progress of batch B relative to a reference batch B0 is
# E(B0)/E(B) = (φ + B0)/(φ + B): the "statistical efficiency" of AdaptDL/Pollux (Qiao et al.,
# OSDI 2021). Their "goodput" is throughput × efficiency: useful examples per second. B0 only
# rescales efficiency and goodput, never their argmax; B0 = 0 gives E_min/E = φ/(φ + B), the
# fraction of the best possible per-example progress.


def statistical_efficiency(
    batch_size: float, noise_scale: float, reference_batch: float = 0.0
) -> float:
    """(φ + B0) / (φ + B): per-example progress at ``batch_size`` relative to ``reference_batch``.

    φ = ``noise_scale`` (B_simple as the estimate of B_crit). Pollux eq. 1; equals
    examples_ratio(B0, φ) / examples_ratio(B, φ) of docs/science.md's S-E model, and with
    B0 = 0 it is E_min / E = 1 / examples_ratio(B, φ).
    """
    if not batch_size > 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if reference_batch < 0:
        raise ValueError(f"reference_batch must be >= 0, got {reference_batch}")
    check_non_negative("noise_scale", noise_scale)
    if noise_scale == 0.0 and reference_batch == 0.0:
        return 0.0
    return (noise_scale + reference_batch) / (noise_scale + batch_size)


def goodput(
    throughput: float, batch_size: float, noise_scale: float, reference_batch: float = 0.0
) -> float:
    """Pollux goodput = throughput × statistical efficiency (useful examples per second).

    ``throughput`` is examples (or tokens) per second measured at ``batch_size``.
    """
    if throughput < 0:
        raise ValueError(f"throughput must be >= 0, got {throughput}")
    return throughput * statistical_efficiency(batch_size, noise_scale, reference_batch)


def interpolate_throughput(
    batch_sizes: Sequence[float], throughputs: Sequence[float], batch_size: float
) -> float | None:
    """Throughput at ``batch_size`` from measurements, linear in log-log between neighbours.

    Throughput typically rises like a power of B and then saturates, which is piecewise linear
    in log-log. No extrapolation: None outside the measured range.
    """
    if len(batch_sizes) != len(throughputs):
        raise ValueError("batch_sizes and throughputs must have the same length")
    points = sorted(zip(batch_sizes, throughputs, strict=True))
    if not points:
        return None
    for b, t in points:
        if not b > 0 or not t > 0:
            raise ValueError(f"batch sizes and throughputs must be positive, got ({b}, {t})")
    if batch_size < points[0][0] or batch_size > points[-1][0]:
        return None
    for i in range(len(points) - 1):
        (b_lo, t_lo), (b_hi, t_hi) = points[i], points[i + 1]
        if b_lo <= batch_size <= b_hi:
            if b_hi == b_lo:
                return t_lo
            frac = math.log(batch_size / b_lo) / math.log(b_hi / b_lo)
            return math.exp(math.log(t_lo) + frac * (math.log(t_hi) - math.log(t_lo)))
    return points[0][1]  # a single measured batch size


def goodput_optimal_batch(
    batch_sizes: Sequence[float],
    throughputs: Sequence[float],
    noise_scale: float,
    candidates: Sequence[float] | None = None,
    reference_batch: float = 0.0,
) -> tuple[float, float]:
    """The batch size maximising goodput, and that goodput (Pollux's batch-size choice).

    Candidates are the measured batch sizes plus ``candidates`` inside the measured range
    (throughput interpolated by ``interpolate_throughput``); ties go to the smaller batch.
    """
    pool = sorted(set(batch_sizes) | set(candidates or ()))
    best: tuple[float, float] | None = None
    for b in pool:
        t = interpolate_throughput(batch_sizes, throughputs, b)
        if t is None:
            continue
        g = goodput(t, b, noise_scale, reference_batch)
        if best is None or g > best[1] * (1.0 + 1e-12):
            best = (b, g)
    if best is None:
        raise ValueError("need at least one measured (batch size, throughput) pair")
    return best


def scaled_lr(base_lr: float, batch_size: float, base_batch_size: float, rule: str) -> float:
    """Learning rate at ``batch_size`` when ``base_lr`` was tuned at ``base_batch_size``.

    "linear": lr ∝ B (Goyal et al. 2017; plain SGD well below B_crit, where a step of batch B
    does the work of B/B0 small steps: S ≈ S_min B_crit/B in docs/science.md's model); "sqrt":
    lr ∝ √B (Adam-family optimizers; Malladi et al. 2022); "none" (or "constant"): unchanged.
    """
    powers = {"linear": 1.0, "sqrt": 0.5, "none": 0.0, "constant": 0.0}
    if rule not in powers:
        raise ValueError(f"lr rule must be 'linear', 'sqrt', 'constant' or 'none', got {rule!r}")
    if not (batch_size > 0 and base_batch_size > 0):
        raise ValueError("batch sizes must be positive")
    return float(base_lr * (batch_size / base_batch_size) ** powers[rule])


def noise_scaled_lr(max_lr: float, batch_size: float, noise_scale: float) -> float:
    """ε_opt(B) = ε_max / (1 + B_noise/B): the best SGD step size at batch B.

    McCandlish et al. 2018, Sec. 2.1 (the step that maximises the expected loss decrease of a
    noisy quadratic step); ``max_lr`` is ε_max, the best step at an infinite batch, which on a
    real model is the stability-limited learning rate of a large batch. Linear in B well below
    B_noise, flat above it: the "linear" rule with its cap, with the knee where the noise is.
    """
    if not (max_lr > 0 and batch_size > 0):
        raise ValueError("max_lr and batch_size must be positive")
    check_non_negative("noise_scale", noise_scale)
    return max_lr / (1.0 + noise_scale / batch_size)


def adaptive_batch_target(noise_scale: float, reference_batch: float) -> float:
    """B(t) = √(B_noise(t) · B_ref): the batch that minimises S + E/B_ref over a run.

    In docs/science.md's model a step at batch B costs dS = dS_min (1 + B_noise/B) and
    dE = dS_min (B + B_noise); minimising dS + dE/B_ref at each moment gives B² = B_noise · B_ref
    (derivation in docs/adaptive_batch.md). Whatever B_ref, the run then lies strictly inside the
    fixed-batch hyperbola (S/S_min − 1)(E/E_min − 1) = 1 whenever B_noise changes during the run
    (Cauchy–Schwarz), while B = κ·B_noise lies on it: B_ref is the exchange rate, the number of
    examples one optimizer step is worth.
    """
    check_positive("reference_batch", reference_batch)
    check_non_negative("noise_scale", noise_scale)
    return math.sqrt(noise_scale * reference_batch)
