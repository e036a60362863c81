"""The critical-batch frames: the targets' table, the sweep's points and curves, B_crit beside
B_simple, with interval ends clipped to what a log axis can draw."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from noisescope.sweep import CriticalBatchReport, TargetResult
from noisescope_dashboard import _text
from noisescope_dashboard._charts._axes import interval_ends, log_extent

B_CRIT = "B_crit (sweep fit)"
B_SIMPLE_AT_LOSS = "B_simple at the same loss"

#: The critical-batch charts end their log axis this factor beyond the data (interval ends
#: past it are drawn at it).
_PAD = 3.0


def frontier_text(target: TargetResult) -> str:
    """The frontier in words: "16 → lr 0.1, 120 steps; 32 → lr 0.2, 64 steps"."""
    parts = []
    for p in target.points:
        lr = f"lr {p.lr:.3g}" if p.lr is not None else "lr not logged"
        parts.append(f"{_text.count(p.batch_size)} → {lr}, {_text.count(p.steps)} steps")
    return "; ".join(parts)


def target_warnings(target: TargetResult) -> list[str]:
    """The API's warnings on a target, and why B_simple at its loss is missing, if it is."""
    extra = [f"B_simple at this loss: {target.b_simple_reason}"] if target.b_simple_reason else []
    return [*target.warnings, *extra]


def target_table(report: CriticalBatchReport) -> pd.DataFrame:
    """One row per loss target. B_crit, S_min and E_min only where the fit is determined;
    otherwise "not determined" and the warnings say why."""
    units = report.units
    rows = []
    for t in report.targets:
        ok = t.determined and t.b_crit is not None
        rows.append(
            {
                "loss target": _text.target(t.target),
                "B_crit": _text.count(t.b_crit) if ok else "not determined",
                "B_crit 90% interval": _text.interval(t.b_crit_lo, t.b_crit_hi) if ok else "",
                "S_min (steps)": _text.count(t.s_min) if ok else "",
                f"E_min ({units})": _text.count(t.e_min) if ok else "",
                "B_simple at this loss": _text.count(t.b_simple) if t.b_simple is not None else "",
                "B_simple 90% interval": _text.interval(t.b_simple_lo, t.b_simple_hi),
                # in full under the table: a sentence each would be cut off in a cell
                "warnings": warnings_cell(len(target_warnings(t))),
            }
        )
    return pd.DataFrame(rows)


def warnings_cell(n: int) -> str:
    """The per-target table's warnings cell: how many, and where they are in full."""
    return f"{n} warning{'s' if n != 1 else ''} (under the table)" if n else ""


def frontier_table(report: CriticalBatchReport) -> pd.DataFrame:
    """The frontier of every target, one row per target and batch size (a row each, so no
    cell runs past the page's edge): loss target, batch size, the fastest lr, its steps and
    the seeds whose median they are."""
    rows = [
        {
            "loss target": _text.target(t.target),
            f"batch size ({report.units})": _text.count(p.batch_size),
            "fastest lr": f"{p.lr:.3g}" if p.lr is not None else "not logged",
            "steps (median of its seeds)": _text.count(p.steps),
            "seeds": _text.count(len(p.run_uids)),
        }
        for t in report.targets
        for p in t.points
    ]
    columns = ["loss target", f"batch size ({report.units})", "fastest lr"]
    columns += ["steps (median of its seeds)", "seeds"]
    return pd.DataFrame(rows, columns=columns)


def sweep_points(report: CriticalBatchReport) -> pd.DataFrame:
    """Every run that reached a target: target (label), run, batch_size, lr, steps, examples,
    frontier (whether the fit used it)."""
    rows = [
        {
            "target": f"loss {_text.target(t.target)}",
            "run": r.name,
            "batch_size": r.batch_size,
            "lr": r.lr,
            "steps": r.steps,
            "examples": r.examples,
            "frontier": r.frontier,
        }
        for t in report.targets
        for r in t.runs
        if r.steps is not None and r.examples is not None
    ]
    columns = ["target", "run", "batch_size", "lr", "steps", "examples", "frontier"]
    frame = pd.DataFrame(rows, columns=columns)
    frame["frontier"] = frame["frontier"].astype(bool)
    return frame


def sweep_curves(report: CriticalBatchReport) -> pd.DataFrame:
    """The fitted S-E hyperbola of every *determined* target (an undetermined fit is not
    drawn: its curve would look like an answer)."""
    rows = [
        {
            "target": f"loss {_text.target(t.target)}",
            "batch_size": c.batch_size,
            "steps": c.steps,
            "examples": c.examples,
        }
        for t in report.targets
        if t.determined
        for c in t.curve
    ]
    return pd.DataFrame(rows, columns=["target", "batch_size", "steps", "examples"])


def bcrit_vs_loss(report: CriticalBatchReport) -> pd.DataFrame:
    """B_crit of each determined target and B_simple at each target's loss, with intervals:
    loss, value, lo, hi, lo_shown, hi_shown, quantity, interval."""
    rows: list[dict[str, Any]] = []
    for t in report.targets:
        if t.determined and t.b_crit is not None:
            rows.append(
                {"loss": t.target, "value": t.b_crit, "lo": t.b_crit_lo, "hi": t.b_crit_hi}
                | {"quantity": B_CRIT}
            )
        if t.b_simple is not None:
            rows.append(
                {"loss": t.target, "value": t.b_simple, "lo": t.b_simple_lo, "hi": t.b_simple_hi}
                | {"quantity": B_SIMPLE_AT_LOSS}
            )
    frame = pd.DataFrame(rows, columns=["loss", "value", "lo", "hi", "quantity"])
    floor, ceiling = log_extent((r["value"] for r in rows), _PAD)
    frame["lo_shown"], frame["hi_shown"] = interval_ends(frame["lo"], frame["hi"], floor, ceiling)
    frame["interval"] = [
        _text.interval(lo, hi) or "unknown" for lo, hi in zip(frame["lo"], frame["hi"], strict=True)
    ]
    return frame


def tasks_b_simple_vs_b_crit(
    reports: Sequence[CriticalBatchReport],
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The paper's cross-task figure: one row per (task, target) whose fit is determined and
    whose B_simple at that loss is measured; and the targets left out, with why."""
    points: list[dict[str, Any]] = []
    left_out: list[dict[str, str]] = []
    for rep in reports:
        key = _text.task_key(rep.project, rep.task)
        for t in rep.targets:
            point = t.b_simple_vs_b_crit()
            if point is not None:
                points.append({"task": key, "units": rep.units, **point})
                continue
            why = []
            if not (t.determined and t.b_crit is not None):
                why += t.warnings or ["B_crit is not determined"]
            if t.b_simple is None:
                why.append(f"B_simple at this loss: {t.b_simple_reason or 'not measured'}")
            left_out.append(
                {"task": key, "loss target": _text.target(t.target), "why": " · ".join(why)}
            )
        if not rep.targets:
            left_out.append(
                {"task": key, "loss target": "", "why": " · ".join(rep.warnings) or "no target"}
            )
    columns = ["task", "target", "units", "b_crit", "b_crit_lo", "b_crit_hi"]
    columns += ["b_simple", "b_simple_lo", "b_simple_hi"]
    frame = pd.DataFrame(points, columns=columns)
    for q in ("b_crit", "b_simple"):
        frame[f"{q}_lo_shown"] = frame[f"{q}_hi_shown"] = 0.0
    # each unit is its own chart, so open interval ends are drawn to that chart's axis
    for _, part in frame.groupby("units"):
        floor, ceiling = log_extent([*part["b_crit"], *part["b_simple"]], _PAD)
        for q in ("b_crit", "b_simple"):
            lo, hi = interval_ends(part[f"{q}_lo"], part[f"{q}_hi"], floor, ceiling)
            frame.loc[part.index, f"{q}_lo_shown"] = lo
            frame.loc[part.index, f"{q}_hi_shown"] = hi
    for q in ("b_crit", "b_simple"):
        frame[f"{q}_interval"] = [
            _text.interval(lo, hi) or "unknown"
            for lo, hi in zip(frame[f"{q}_lo"], frame[f"{q}_hi"], strict=True)
        ]
    return frame, pd.DataFrame(left_out, columns=["task", "loss target", "why"])
