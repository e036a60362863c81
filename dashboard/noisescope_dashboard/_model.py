"""Turning bucketed sums into the numbers the pages show, by calling ``noisescope.estimators``.

No formula is written here: window ratios come from ``NoiseScale.from_sums``, moving averages
from ``EMA``, intervals from the estimator module's block interval, and the steps/examples
trade-off from ``steps_ratio`` / ``examples_ratio`` / ``fit_critical_batch`` (science.md,
"Critical batch size from batch-size sweeps"). This module only arranges rows and words.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from noisescope import estimators
from noisescope.estimators import EMA, NoiseScale, examples_ratio, steps_ratio

__all__ = [
    "CriticalBatchResult",
    "block_interval",
    "critical_batch_analysis",
    "default_targets",
    "format_batch",
    "loss_crossings",
    "place_events",
    "smooth",
    "smooth_groups",
    "tradeoff_curve",
    "verdict",
]

#: Two-sided level of every interval the dashboard draws.
LEVEL = 0.9


def block_interval(
    sums_g_sq: Sequence[float], sums_trace_sigma: Sequence[float], counts: Sequence[float]
) -> tuple[float | None, float | None]:
    """90% interval on B_simple from contiguous per-block sums (``interval_from_blocks``).

    (None, None) where the estimator module gives none (fewer than 2 blocks, |G|^2 not
    significantly positive): the chart then draws the line without a band, never a made-up one.
    """
    fn = getattr(estimators, "interval_from_blocks", None)
    if fn is None or len(counts) < 2:
        return None, None
    try:
        result = fn(list(counts), list(sums_g_sq), list(sums_trace_sigma), level=LEVEL)
    except (ValueError, ZeroDivisionError):
        return None, None
    b_iv = getattr(result, "b_simple", None)
    if b_iv is None:
        return None, None
    return float(b_iv.lo), float(b_iv.hi)


def smooth(
    buckets: pd.DataFrame,
    *,
    method: str = "window",
    window_steps: float = 100.0,
    beta: float = 0.99,
    interval: bool = True,
) -> pd.DataFrame:
    """Add g_sq, trace_sigma, b_simple, b_simple_lo/hi to a frame of bucket sums (one series).

    ``method="window"``: trailing window of ``window_steps`` steps; the window's sums are exact
    (sums of the linear estimators), B_simple = sum(𝒮)/sum(|𝒢|^2) via ``NoiseScale.from_sums``,
    and its interval from the window's buckets as blocks.
    ``method="ema"``: the estimator module's debiased ``EMA`` of |𝒢|^2 and 𝒮 (ratio last); a
    bucket of n steps advances it with beta**n so the half-life stays in steps, not buckets.
    ``method="none"``: each bucket on its own.
    ``interval=False`` skips the intervals (the Compare pages draw no bands).
    """
    # An EMA with this beta averages like a flat window of (1 + beta) / (1 - beta) steps (same
    # variance weight); its band is that window's interval.
    span_for_interval = window_steps if method == "window" else (1 + beta) / (1 - beta)
    out = buckets.reset_index(drop=True).copy()
    n_rows = len(out)
    g_sq: list[float] = []
    trace_sigma: list[float] = []
    b_simple: list[float | None] = []
    lo: list[float | None] = []
    hi: list[float | None] = []
    sum_g = out["sum_g_sq"].astype(float).tolist()
    sum_t = out["sum_trace_sigma"].astype(float).tolist()
    counts = out["n"].astype(float).tolist()
    steps = out["step"].astype(float).tolist()
    if method == "ema":
        ema = EMA(beta=beta)
        for i in range(n_rows):
            n = max(counts[i], 1.0)
            ema.beta = beta**n
            ema.update(sum_g[i] / n, sum_t[i] / n)
            value = ema.value
            g_sq.append(value.g_sq)
            trace_sigma.append(value.trace_sigma)
            b_simple.append(value.b_simple)
            start = _window_start(steps, i, span_for_interval)
            lo_i, hi_i = _interval_at(sum_g, sum_t, counts, start, i, interval)
            lo.append(lo_i)
            hi.append(hi_i)
    else:
        span = window_steps if method == "window" else 0.0
        acc_g = 0.0
        acc_t = 0.0
        acc_n = 0.0
        start = 0
        for i in range(n_rows):
            acc_g += sum_g[i]
            acc_t += sum_t[i]
            acc_n += counts[i]
            new_start = _window_start(steps, i, span)
            while start < new_start:
                acc_g -= sum_g[start]
                acc_t -= sum_t[start]
                acc_n -= counts[start]
                start += 1
            value = NoiseScale.from_sums(acc_g, acc_t, acc_n)
            g_sq.append(value.g_sq)
            trace_sigma.append(value.trace_sigma)
            b_simple.append(value.b_simple)
            lo_i, hi_i = _interval_at(sum_g, sum_t, counts, start, i, interval)
            lo.append(lo_i)
            hi.append(hi_i)
    out["g_sq"] = g_sq
    out["trace_sigma"] = trace_sigma
    out["b_simple"] = pd.array(b_simple, dtype="Float64").astype(float)
    out["b_simple_lo"] = pd.array(lo, dtype="Float64").astype(float)
    out["b_simple_hi"] = pd.array(hi, dtype="Float64").astype(float)
    return out


def _interval_at(
    sum_g: list[float], sum_t: list[float], counts: list[float], start: int, end: int, on: bool
) -> tuple[float | None, float | None]:
    if not on:
        return None, None
    return block_interval(sum_g[start : end + 1], sum_t[start : end + 1], counts[start : end + 1])


def smooth_groups(
    frame: pd.DataFrame,
    *,
    method: str = "window",
    window_steps: float = 100.0,
    beta: float = 0.99,
    by: Sequence[str] = ("run", "series"),
    window_frac: float | None = None,
    interval: bool = True,
) -> pd.DataFrame:
    """``smooth`` each (run, series) group; adds ``progress`` = step / the run's last step.

    ``window_frac`` sets each group's window to that fraction of its own step range, so runs of
    different lengths are smoothed alike on the Compare pages.
    """
    if frame.empty:
        out = frame.copy()
        for col in ("g_sq", "trace_sigma", "b_simple", "b_simple_lo", "b_simple_hi", "progress"):
            out[col] = pd.Series(dtype="float")
        return out
    parts = [
        smooth(
            group,
            method=method,
            window_steps=window_steps
            if window_frac is None
            else max(1.0, window_frac * float(group["step"].max())),
            beta=beta,
            interval=interval,
        )
        for _, group in frame.groupby(list(by), sort=False)
    ]
    out = pd.concat(parts, ignore_index=True)
    last = out.groupby("run")["step"].transform("max").astype(float)
    out["progress"] = out["step"].astype(float) / last.where(last > 0, 1.0)
    return out


def _window_start(steps: Sequence[float], i: int, span: float) -> int:
    """First bucket index inside the trailing window of ``span`` steps that ends at bucket i."""
    lo = steps[i] - span
    # Buckets are sorted by step; a linear walk back is fine for <= 2000 rows.
    j = i
    while j > 0 and steps[j - 1] > lo:
        j -= 1
    return j


def place_events(events: pd.DataFrame, whole: pd.DataFrame, x: str) -> pd.DataFrame:
    """Give each event (placed by step) a position on the chosen x axis, by interpolation."""
    out = events.copy()
    if out.empty or x == "step" or whole.empty:
        return out
    known = whole.dropna(subset=["step", x]).sort_values("step")
    if known.empty:
        out[x] = float("nan")
        return out
    out[x] = np.interp(
        out["step"].astype(float), known["step"].astype(float), known[x].astype(float)
    )
    return out


def format_batch(value: float) -> str:
    """Batch sizes as people write them: 256, 1.5k, 2.1M."""
    if value >= 1e6:
        return f"{value / 1e6:.3g}M"
    if value >= 1e4:
        return f"{value / 1e3:.3g}k"
    return f"{value:.4g}"


def _ratio_text(ratio: float) -> str:
    return f"{ratio:.1g}" if ratio < 1 else f"{ratio:.2g}"


def verdict(
    batch_size: float,
    b_simple: float | None,
    *,
    units: str = "examples",
    reference: str = "B_simple",
) -> str:
    """A plain-language reading of the batch in use against B_simple (science.md's model).

    Takes B_crit ≈ B_simple (the paper's finding; B_simple may underestimate it early on) and
    compares the batch in use with doubling or halving it through ``steps_ratio`` and
    ``examples_ratio``: "batch 256 is ~0.3× B_simple: doubling it would cut steps by ~38% for
    ~23% more examples".
    """
    if b_simple is None or not b_simple > 0 or not batch_size > 0:
        return f"{reference} is not yet measurable, so there is no verdict on the batch size yet."
    ratio = batch_size / b_simple
    head = f"batch {format_batch(batch_size)} is ~{_ratio_text(ratio)}× {reference}"
    s_now = steps_ratio(batch_size, b_simple)
    e_now = examples_ratio(batch_size, b_simple)
    if ratio < 0.5:
        s_2x = steps_ratio(2 * batch_size, b_simple)
        e_2x = examples_ratio(2 * batch_size, b_simple)
        return (
            f"{head}: doubling it would cut steps by ~{(1 - s_2x / s_now) * 100:.0f}% "
            f"for ~{(e_2x / e_now - 1) * 100:.0f}% more {units}."
        )
    if ratio > 2.0:
        s_half = steps_ratio(batch_size / 2, b_simple)
        e_half = examples_ratio(batch_size / 2, b_simple)
        return (
            f"{head}: halving it would save ~{(1 - e_half / e_now) * 100:.0f}% of the {units} "
            f"for ~{(s_half / s_now - 1) * 100:.0f}% more steps."
        )
    return (
        f"{head}: near the balance point, at ~{s_now:.2g}× the minimum steps and "
        f"~{e_now:.2g}× the minimum {units}."
    )


def tradeoff_curve(
    b_crit: float, *, lo: float | None = None, hi: float | None = None
) -> pd.DataFrame:
    """Steps and examples relative to their minimum over batch sizes spanning B_crit / 100..x100."""
    lo = lo if lo is not None else b_crit / 100.0
    hi = hi if hi is not None else b_crit * 100.0
    n = 120
    sizes = [lo * (hi / lo) ** (i / (n - 1)) for i in range(n)]
    return pd.DataFrame(
        {
            "batch_size": sizes,
            "steps_ratio": [steps_ratio(b, b_crit) for b in sizes],
            "examples_ratio": [examples_ratio(b, b_crit) for b in sizes],
        }
    )


@dataclass(frozen=True)
class CriticalBatchResult:
    """Per-target fits and the frames the Critical batch size page draws."""

    points: pd.DataFrame  # target, run, batch_size, steps, examples
    fits: pd.DataFrame  # target, s_min, e_min, b_crit, b_crit_stderr, n_points
    curves: pd.DataFrame  # target, batch_size, steps, examples
    messages: list[str]


def critical_batch_analysis(
    crossings: pd.DataFrame, targets: Sequence[float]
) -> CriticalBatchResult:
    """Fit the S-E hyperbola per loss target with ``fit_critical_batch`` (science.md Sec. 2.2-3).

    ``crossings``: one row per (run, target) the run reached: target, run, batch_size, steps,
    examples. Targets that cannot be fitted get a message saying why, instead of a curve.
    """
    fits: list[dict[str, Any]] = []
    curves: list[pd.DataFrame] = []
    messages: list[str] = []
    for target in targets:
        rows = crossings[crossings["target"] == target] if not crossings.empty else crossings
        sizes = sorted({float(b) for b in rows["batch_size"]}) if not rows.empty else []
        if len(sizes) < 3:
            messages.append(
                f"loss {target:g}: reached by runs at {len(sizes)} distinct batch size(s) "
                f"({', '.join(format_batch(b) for b in sizes) or 'none'}); a fit needs at least 3. "
                "Run the task at more batch sizes, or pick a target the runs reach."
            )
            continue
        try:
            fit = estimators.fit_critical_batch(
                [float(b) for b in rows["batch_size"]], [float(s) for s in rows["steps"]]
            )
        except ValueError as exc:
            messages.append(f"loss {target:g}: no fit: {exc}")
            continue
        fits.append(
            {
                "target": target,
                "s_min": fit.s_min,
                "e_min": fit.e_min,
                "b_crit": fit.b_crit,
                "b_crit_stderr": fit.b_crit_stderr,
                "n_points": fit.n_points,
            }
        )
        curve = tradeoff_curve(fit.b_crit, lo=min(sizes) / 4, hi=max(sizes) * 4)
        curves.append(
            pd.DataFrame(
                {
                    "target": target,
                    "batch_size": curve["batch_size"],
                    "steps": curve["steps_ratio"] * fit.s_min,
                    "examples": curve["examples_ratio"] * fit.e_min,
                }
            )
        )
    fit_cols = ["target", "s_min", "e_min", "b_crit", "b_crit_stderr", "n_points"]
    return CriticalBatchResult(
        points=crossings,
        fits=pd.DataFrame(fits, columns=fit_cols),
        curves=pd.concat(curves, ignore_index=True)
        if curves
        else pd.DataFrame(columns=["target", "batch_size", "steps", "examples"]),
        messages=messages,
    )


def default_targets(smoothed: pd.DataFrame, n: int = 4) -> list[float]:
    """Loss targets every run of the task reaches: spread between the runs' start and best loss.

    The easiest target is below every run's first bucket, the hardest is the worst run's best
    loss, so each target can be reached by all batch sizes (a fit needs them).
    """
    whole = smoothed[smoothed["series"] == ""] if "series" in smoothed else smoothed
    per_run = whole.dropna(subset=["loss"]).groupby("run")["loss"]
    if per_run.ngroups == 0:
        return []
    start = float(per_run.first().min())
    hardest = float(per_run.min().max())
    if not start > hardest:
        return []
    fractions = [0.5, 0.25, 0.1, 0.02][:n]
    return [float(f"{hardest + (start - hardest) * f:.3g}") for f in fractions]


def loss_crossings(
    smoothed: pd.DataFrame, runs: pd.DataFrame, targets: Sequence[float]
) -> pd.DataFrame:
    """First bucket where each run's (bucket-mean) loss is at or below each target.

    Columns: target, run, batch_size, steps, examples, b_simple (the run's windowed B_simple at
    that bucket: B_simple measured at the same loss as the fitted B_crit).
    """
    cols = ["target", "run", "batch_size", "steps", "examples", "b_simple"]
    whole = smoothed[smoothed["series"] == ""] if "series" in smoothed else smoothed
    batch = runs.set_index("uid")["batch_size"]
    rows: list[dict[str, Any]] = []
    for uid, group in whole.groupby("run", sort=False):
        g = group.dropna(subset=["loss"]).sort_values("step")
        b = batch.get(uid)
        if g.empty or b is None or not pd.notna(b):
            continue
        for target in targets:
            hit = g[g["loss"] <= target]
            if hit.empty:
                continue
            first = hit.iloc[0]
            rows.append(
                {
                    "target": float(target),
                    "run": uid,
                    "batch_size": float(b),
                    "steps": float(first["step"]),
                    "examples": float(first["examples"])
                    if pd.notna(first["examples"])
                    else float(first["step"]) * float(b),
                    "b_simple": float(first["b_simple"]) if pd.notna(first["b_simple"]) else None,
                }
            )
    return pd.DataFrame(rows, columns=cols)
