"""The checks a researcher would make before trusting a sweep's answer (docs/science.md,
"What the sweep checks"): did a run diverge, does the frontier's learning rate sit at an edge
of the grid tried, and does each frontier point have seeds enough to show its spread.

Each is a pure function of the sweep's inputs; ``_analyse`` calls them and puts their words in
the report's ``excluded`` and ``warnings``, so the API and the dashboard say the same thing.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from noisescope._format import count as _fmt

from ._report import FrontierPoint, SweepRun

#: A run diverged when its loss at the end gives back at least this share of the progress it
#: had made (its first loss minus its minimum): 0.5 is far past any noise of a smoothed or
#: evaluation loss, and what "rising far above its minimum" looks like on the digits sweep of
#: issue 28 (2.3 -> 0.4 -> 2.41: all of it given back).
DIVERGED_GIVE_BACK = 0.5
#: ... and the rise is at least this fraction of the minimum's size, so the wiggles of a run
#: that never learnt (a tiny "progress" given back by noise) are no divergence.
DIVERGED_MIN_RISE = 0.1
#: "The end" is the median loss over the last this share of the run's steps: one bad minibatch
#: (or the shrunken smoothing window at the last point) is not the run's loss.
DIVERGED_TAIL = 0.1


def divergence(steps: Sequence[float], losses: Sequence[float]) -> str | None:
    """Why a run's loss curve diverged, in words, or None when it did not.

    A curve diverged when it holds a non-finite loss (NaN or inf: the optimiser blew up), or
    when its end (the median over the last ``DIVERGED_TAIL`` of its steps) lies above the
    minimum it reached before then by at least ``DIVERGED_GIVE_BACK`` of the progress it had
    made and by at least ``DIVERGED_MIN_RISE`` of the minimum. A spike the run recovers from
    is no divergence; a run still falling is never one. ``steps`` increase; ``losses`` should
    be the curve the sweep crosses targets on (evaluations or the smoothed training loss).
    """
    if len(steps) != len(losses):
        raise ValueError("steps and losses must have the same length")
    for s, x in zip(steps, losses, strict=True):
        if not math.isfinite(x):
            return f"its loss became {x} at step {_fmt(s)}"
    if len(steps) < 3:
        return None
    start = float(losses[0])
    first, last = float(steps[0]), float(steps[-1])
    cut = last - DIVERGED_TAIL * (last - first)
    before = [(float(x), float(s)) for s, x in zip(steps, losses, strict=True) if s < cut]
    if not before:
        return None
    low, at = min(before)  # the minimum reached before the end
    end = statistics.median(float(x) for s, x in zip(steps, losses, strict=True) if s >= cut)
    rise = end - low
    if (
        rise <= 0
        or rise < DIVERGED_GIVE_BACK * (start - low)
        or rise < DIVERGED_MIN_RISE * abs(low)
    ):
        return None
    return (
        f"its loss rose from {low:.3g} (its minimum, at step {_fmt(at)}) to {end:.3g} by step "
        f"{_fmt(last)} (it started at {start:.3g})"
    )


def _sizes(values: Sequence[float]) -> str:
    return ", ".join(_fmt(b) for b in values)


def _batch_sizes(values: Sequence[float]) -> str:
    return ("batch size " if len(values) == 1 else "batch sizes ") + _sizes(values)


def lr_grid_warnings(runs: Sequence[SweepRun], points: Sequence[FrontierPoint]) -> list[str]:
    """Where the frontier's learning rate is not known to be the best one: at each batch size
    whose fastest learning rate is the largest or the smallest tried there (with two or more
    tried; ``runs`` should include the runs left out as diverged, which bound the grid too), or
    where only one was tried. The steps there are an upper bound on the tuned steps, which
    biases the fit; the answer stays ``determined`` (its statistics are sound) and says so."""
    tried: dict[float, set[float]] = {}
    for r in runs:
        if r.lr is not None:
            tried.setdefault(r.batch_size, set()).add(float(f"{r.lr:.6g}"))  # as ``lr_key``
    edges: dict[str, list[FrontierPoint]] = {"largest": [], "smallest": [], "only": []}
    for p in points:
        grid = tried.get(p.batch_size, set())
        if p.lr is None or not grid:
            continue
        lr = float(f"{p.lr:.6g}")
        if len(grid) == 1:
            edges["only"].append(p)
        elif lr == max(grid):
            edges["largest"].append(p)
        elif lr == min(grid):
            edges["smallest"].append(p)
    out = []
    for which, beyond in (("largest", "larger"), ("smallest", "smaller")):
        at = edges[which]
        if at:
            out.append(
                f"at {_batch_sizes([p.batch_size for p in at])} the fastest learning rate is the "
                f"{which} tried there ({_lrs(at)}): the optimum may lie beyond the grid, so the "
                f"steps there are an upper bound; try {beyond} learning rates"
            )
    if edges["only"]:
        at = edges["only"]
        out.append(
            f"at {_batch_sizes([p.batch_size for p in at])} only one learning rate was tried "
            f"({_lrs(at)}): the learning rate is not tuned there, so the steps there are an upper "
            "bound; try learning rates on both sides of it"
        )
    return out


def _lrs(points: Sequence[FrontierPoint]) -> str:
    values = sorted({float(f"{p.lr:.6g}") for p in points if p.lr is not None})
    return "lr " + ", ".join(f"{v:g}" for v in values)


def seed_warning(points: Sequence[FrontierPoint]) -> str | None:
    """A warning when a frontier point rests on one seed: its steps have no spread measured,
    so the fit's interval knows the seed-to-seed noise only from the scatter between batch
    sizes (docs/science.md, "What the sweep checks"). None when every point has two or more."""
    single = [p.batch_size for p in points if len(p.run_uids) < 2]
    if not single:
        return None
    if len(single) == len(points):
        return (
            f"every frontier point comes from a single seed (1 seed at each of "
            f"{_batch_sizes(single)}): the steps have no spread measured, so the interval rests "
            "on the fit's scatter alone; run 2 or more seeds per batch size at its fastest "
            "learning rate"
        )
    seeds = "; ".join(f"{_fmt(p.batch_size)}: {len(p.run_uids)}" for p in points)
    return (
        f"at {_batch_sizes(single)} the frontier point comes from a single seed while others "
        f"have several (seeds per batch size: {seeds}): its steps have no spread measured; run "
        "more seeds there"
    )
