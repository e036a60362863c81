"""The run and task tables, and several runs' points for the comparison charts."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pandas as pd

from noisescope import RunSeries, RunSummary, TaskSummary
from noisescope.estimators import CURRENT_MIN_SAMPLES
from noisescope_dashboard import _text


def runs_table(runs: Iterable[RunSummary]) -> pd.DataFrame:
    """The Runs table: the API's fields as text people read ("1,860", "0.3×"), with the raw
    numbers beside them (``_``-prefixed, hidden) for sorting. A run whose current window gives
    no B_simple has no number and no ratio, says why, and shows "≥ N" where a lower bound is
    known."""
    rows = []
    for r in runs:
        measured = r.b_simple is not None
        rows.append(
            {
                "uid": r.uid,
                "name": r.name,
                "project": r.project,
                "task": r.task,
                "status": _text.status(r),
                "tags": ", ".join(r.tags),
                "batch": _text.count(r.batch_in_use),
                "units": r.units,
                "b_simple": _text.b_simple_now(r),
                # a bound row ("≥ 44.7") shows the interval its reason names too
                "interval": _text.interval(r.b_simple_lo, r.b_simple_hi)
                if measured or r.b_simple_lower is not None
                else "",
                "ratio": _text.ratio(r.batch_to_b_simple)
                if measured and r.batch_to_b_simple is not None
                else "",
                "why": _text.no_b_simple_because(r),
                "loss": _text.loss(r.last_loss) if r.last_loss is not None else "",
                "step": _text.count(r.last_step) if r.last_step is not None else "",
                "started_at": r.started_at,
                "_b_simple": r.b_simple,
                "_ratio": r.batch_to_b_simple if measured else None,
                "_loss": r.last_loss,
                "_config": " ".join(f"{k}={v}" for k, v in r.config.items()),
            }
        )
    columns = [
        "uid",
        "name",
        "project",
        "task",
        "status",
        "tags",
        "batch",
        "units",
        "b_simple",
        "interval",
        "ratio",
        "why",
        "loss",
        "step",
        "started_at",
        "_b_simple",
        "_ratio",
        "_loss",
        "_config",
    ]
    frame = pd.DataFrame(rows, columns=columns)
    for c in ("_b_simple", "_ratio", "_loss"):
        frame[c] = pd.to_numeric(frame[c], errors="coerce").astype(float)
    return frame


def left_out_why(run: RunSummary) -> str | None:
    """Why a run is not offered unless asked for (None: it is): its loss diverged, or it has
    fewer samples than a current B_simple needs (``estimators.CURRENT_MIN_SAMPLES``), so its
    curve is a few points drawn as a smooth line."""
    if run.diverged:
        return "diverged"
    if run.n_samples < CURRENT_MIN_SAMPLES:
        return f"under {CURRENT_MIN_SAMPLES} samples"
    return None


def compare_points(series: Sequence[RunSeries], runs: dict[str, RunSummary]) -> pd.DataFrame:
    """Several runs' points: run, run_name, task, units, step, examples, progress (step over
    the run's last step), loss, b_simple."""
    frames = []
    for s in series:
        run = runs.get(s.run_uid)
        if run is None or not s.points:
            continue
        last = float(run.last_step or max(p.step_hi for p in s.points) or 1)
        frames.append(
            pd.DataFrame(
                {
                    "run": run.uid,
                    "run_name": run.name,
                    "task": _text.task_key(run.project, run.task),
                    "units": run.units,
                    "step": [float(p.step_hi) for p in s.points],
                    "examples": [p.examples_hi for p in s.points],
                    "progress": [p.step_hi / last for p in s.points],
                    "loss": [p.loss for p in s.points],
                    "b_simple": [p.b_simple for p in s.points],
                }
            )
        )
    columns = ["run", "run_name", "task", "units", "step", "examples", "progress"]
    columns += ["loss", "b_simple"]
    if not frames:
        return pd.DataFrame(columns=columns)
    out = pd.concat(frames, ignore_index=True)
    for c in ("examples", "loss", "b_simple"):
        out[c] = pd.to_numeric(out[c], errors="coerce").astype(float)
    return out


def task_table(tasks: Iterable[TaskSummary]) -> pd.DataFrame:
    """The per-task summary of ``GET /tasks``, as text."""
    rows = [
        {
            "project": t.project,
            "task": t.task,
            "runs": _text.count(t.n_runs),
            "running": _text.count(t.n_running),
            "batch sizes": ", ".join(_text.count(b) for b in t.batch_sizes),
            "units": ", ".join(t.units),
            "measured runs": _text.task_measured(t),
            "B_simple median": _text.count(t.b_simple_median),
            "B_simple range": _text.interval(t.b_simple_min, t.b_simple_max) or _text.DASH,
        }
        for t in tasks
    ]
    return pd.DataFrame(
        rows,
        columns=[
            "project",
            "task",
            "runs",
            "running",
            "batch sizes",
            "units",
            "measured runs",
            "B_simple median",
            "B_simple range",
        ],
    )


#: Loss bins per group of runs for the median line and its band.
BAND_BINS = 24


def group_label(run: RunSummary, by: str) -> str:
    """The group a run is drawn in on Compare tasks: its batch in use ("batch 64") or its
    learning rate from its config (``lr``; "lr not logged" without one)."""
    if by == "lr":
        lr = run.config.get("lr")
        return f"lr {lr:.3g}" if isinstance(lr, int | float) else "lr not logged"
    return f"batch {_text.count(run.batch_in_use if run.batch_in_use else run.batch_size)}"


def loss_points(points: pd.DataFrame, *, log_loss: bool) -> pd.DataFrame:
    """The points a B_simple-against-loss chart can draw (``compare_points``): both values,
    B_simple above 0 (its axis is log) and, on a log loss axis, the loss too."""
    data = points.dropna(subset=["loss", "b_simple"])
    data = data[data["b_simple"] > 0]
    return data[data["loss"] > 0] if log_loss else data


def band_points(
    points: pd.DataFrame, runs: dict[str, RunSummary], by: str, *, log_loss: bool = False
) -> pd.DataFrame:
    """Per task and group (``group_label``), B_simple against loss as a median line with a
    band: the loss range of the group's points cut into ``BAND_BINS`` bins (log-spaced with
    ``log_loss``), and in each bin the median, lowest and highest of the runs' own medians
    there. Columns: task, units, group, order (a sortable group key), runs, loss (the bin's
    median loss), b_simple, lo, hi."""
    columns = ["task", "units", "group", "order", "runs", "loss", "b_simple", "lo", "hi"]
    data = loss_points(points, log_loss=log_loss)
    if data.empty:
        return pd.DataFrame(columns=columns)
    data = data.assign(
        group=[group_label(runs[u], by) for u in data["run"]],
        order=[_group_order(runs[u], by) for u in data["run"]],
    )
    rows = []
    for (task, units, group, order), part in data.groupby(
        ["task", "units", "group", "order"], sort=True
    ):
        lo_loss, hi_loss = float(part["loss"].min()), float(part["loss"].max())
        if hi_loss <= lo_loss:
            edges = [lo_loss, hi_loss + 1e-12]
        elif log_loss:
            ratio = (hi_loss / lo_loss) ** (1.0 / BAND_BINS)
            edges = [lo_loss * ratio**i for i in range(BAND_BINS + 1)]
        else:
            step = (hi_loss - lo_loss) / BAND_BINS
            edges = [lo_loss + step * i for i in range(BAND_BINS + 1)]
        bins = pd.cut(part["loss"], edges, include_lowest=True, labels=False)
        for _, chunk in part.groupby(bins):
            per_run = chunk.groupby("run")["b_simple"].median()
            rows.append(
                {
                    "task": task,
                    "units": units,
                    "group": group,
                    "order": order,
                    "runs": len(per_run),
                    "loss": float(chunk["loss"].median()),
                    "b_simple": float(per_run.median()),
                    "lo": float(per_run.min()),
                    "hi": float(per_run.max()),
                }
            )
    return pd.DataFrame(rows, columns=columns)


def _group_order(run: RunSummary, by: str) -> float:
    if by == "lr":
        lr = run.config.get("lr")
        return float(lr) if isinstance(lr, int | float) else float("inf")
    return float(run.batch_in_use or run.batch_size or 0.0)
