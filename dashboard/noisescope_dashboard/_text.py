"""Words and numbers as a page shows them: escaping, labels, number formats.

Numbers go through ``noisescope.protocol.format_*`` (the formatter the API's own sentences
use), so a table cell, a metric and a verdict write "1,860", never "1.86e+03". User text (run,
task and project names, tags, config values) goes through ``md`` wherever Streamlit renders
Markdown, so ``**x**``, ``<b>x</b>`` or ``[a](javascript:...)`` appear literally.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timezone
from typing import Any

from noisescope import RunSummary, TaskSummary, protocol
from noisescope.estimators import (
    CURRENT_FRACTION,
    CURRENT_MAX_FACTOR,
    CURRENT_MAX_FRACTION,
    CURRENT_MAX_REL_WIDTH,
    CURRENT_MIN_SAMPLES,
)

__all__ = [
    "CURRENT_RULE",
    "DASH",
    "at_least",
    "b_simple_now",
    "count",
    "hours",
    "interval",
    "loss",
    "md",
    "no_b_simple_because",
    "percent",
    "plural",
    "ratio",
    "run_label",
    "sentence",
    "target",
    "task_key",
    "units_word",
]

#: What a cell shows where there is no number.
DASH = "—"

#: The one rule for "B_simple now" (``estimators.current_noise_scale``), in words.
CURRENT_RULE = (
    f"The run's current B_simple: its last {CURRENT_FRACTION:.0%} of samples (at least "
    f"{CURRENT_MIN_SAMPLES}), widened while the 90% interval is wider than "
    f"{CURRENT_MAX_REL_WIDTH:g}× the value, but never past the last "
    f"{CURRENT_MAX_FRACTION:.0%} of the run nor into older steps whose |G|² or tr(Σ) differ "
    "significantly. A number is shown only when its interval lies within "
    f"{CURRENT_MAX_FACTOR:g}× of it. Where the window gives none, |G|² and tr(Σ) as powers of "
    "the training loss over a longer stretch of the run, read at the loss of its last "
    f"{CURRENT_FRACTION:.0%}, give the number when their interval lies within "
    f"{CURRENT_MAX_FACTOR:g}×; otherwise a lower bound (≥) where one is known. "
    "The same number on the Runs table, the Run page and the API."
)

_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$:&=\"'])")


def md(value: Any) -> str:
    """``value`` escaped for Streamlit Markdown: every character that could start markup is
    backslash-escaped, so the text renders exactly as written."""
    return _MD_SPECIAL.sub(r"\\\1", str(value))


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def count(value: float | None) -> str:
    """A batch size, step or example count ("1,860", "2.1M"); a dash when there is none."""
    return protocol.format_count(value) if value is not None else DASH


def at_least(bound: float | None) -> str:
    """A lower bound on a count ("≥ 380"); empty when there is none."""
    return f"≥ {count(bound)}" if bound is not None else ""


def b_simple_now(run: RunSummary) -> str:
    """A run's current B_simple ("1,860"), else its lower bound ("≥ 380"); empty when it has
    neither."""
    return count(run.b_simple) if run.b_simple is not None else at_least(run.b_simple_lower)


def no_b_simple_because(run: RunSummary) -> str:
    """Why a run has no current B_simple, in the API's words; empty when it has one. A run
    that has ended (finished or failed) gets no more samples: its count is all it has ("8
    samples in all", not "so far"), and it is not measurable rather than "not yet"."""
    if run.b_simple is not None:
        return ""
    reason = run.b_simple_reason or "not yet measurable"
    if run.status in ("finished", "failed"):  # a crashed run may still come back
        reason = (
            reason.replace(" samples so far", " samples in all")
            .replace("not yet measurable", "not measurable")
            .replace("no samples yet", "no samples")
        )
    return reason


def whole(value: float | None) -> str:
    """A count read as a whole number ("6" devices, "98" examples); a dash when there is none."""
    return protocol.format_whole(value) if value is not None else DASH


def ratio(value: float | None, *, limit: float | None = None) -> str:
    """A ratio such as B / B_simple ("0.3×"); a dash when there is none. Against a ``limit``
    (a threshold the page judges by) it never reads as the other side of it ("1.494×")."""
    if value is None:
        return DASH
    if limit is None:
        return f"{protocol.format_ratio(value)}×"
    return f"{protocol.format_ratio_beside(value, limit)}×"


def interval(lo: float | None, hi: float | None) -> str:
    """An interval "lo – hi" in the same format as its value; empty when unknown."""
    if lo is None or hi is None:
        return ""
    return f"{count(lo)} – {count(hi)}"


def loss(value: float | None) -> str:
    """A loss to three significant digits, never with an exponent ("0.524", "2.31", "1,234")."""
    if value is None or not math.isfinite(value):
        return DASH
    if abs(value) >= 100:
        return protocol.format_count(value)
    if value == 0:
        return "0"
    decimals = max(0, 2 - math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f}"


def sentence(text: str) -> str:
    """The API's lower-case phrase (a reason, a notice) as a sentence of its own: capital
    first letter, full stop at the end."""
    text = text.strip()
    if not text:
        return text
    return text[:1].upper() + text[1:] + ("" if text.endswith((".", "!", "?")) else ".")


def target(value: float) -> str:
    """A loss target as the user would type it (0.98, not 0.980)."""
    return f"{value:.4g}" if abs(value) >= 1e-4 else loss(value)


def percent(value: float | None) -> str:
    """A share (0.33 -> "33%")."""
    return f"{value:.0%}" if _finite(value) else DASH


def hours(value: float | None) -> str:
    """A duration given in hours, in the unit people would say it in."""
    if not _finite(value):
        return DASH
    assert value is not None
    if value < 1 / 60:
        return f"{value * 3600:.3g} s"
    if value < 1:
        return f"{value * 60:.3g} min"
    if value < 48:
        return f"{value:.3g} h"
    return f"{value / 24:,.3g} days"


def plural(n: int, word: str) -> str:
    """A count and its noun: "1 run", "18 runs"."""
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def runs_shown(shown: int, read: int, most: int) -> str:
    """The Runs table's caption: how many runs it shows of those read, and, where the read
    stopped at the ``most`` one list takes, that older runs, if there are any, are not
    listed (the list cannot tell)."""
    text = f"{shown:,} of {read:,} runs"
    if read >= most:
        text += (
            f" (the newest {most:,}: a list reads at most that many; "
            "older runs, if any, are not listed)"
        )
    return text


def units_word(units: str, *, singular: bool = False) -> str:
    """ "examples"/"tokens" (or "example"/"token")."""
    word = "tokens" if units == "tokens" else "examples"
    return word[:-1] if singular else word


def task_units(task: TaskSummary) -> str:
    """What a task's batch sizes count: its runs' units ("examples" when it has no run yet)."""
    return task.units[0] if task.units else "examples"


def task_measured(task: TaskSummary) -> str:
    """A task's measured runs, and how many answer as the server last stored them."""
    return f"{task.n_measured} of {task.n_runs}{task_behind(task)}"


def task_unmeasured(task: TaskSummary) -> str:
    """A task without a measured run: "0 of N runs measured", and the runs that lag (not read
    yet is not "measures nothing")."""
    lag = task_lag(task)
    return f"0 of {task.n_runs} runs measured" + (f": {lag}" if lag else "")


def task_behind(task: TaskSummary) -> str:
    """``task_lag`` in brackets after a space; nothing where no run lags."""
    lag = task_lag(task)
    return f" ({lag})" if lag else ""


def task_lag(task: TaskSummary) -> str:
    """How many of a task's runs answer as the server stored them seconds ago, and how many it
    has not read yet (``TaskSummary.n_behind``, ``n_unread``): those count as unmeasured
    whatever their samples hold, so "0 of 2" must not read as runs that measure nothing."""
    stored = task.n_behind - task.n_unread
    parts = [f"{stored} as of seconds ago"] if stored > 0 else []
    if task.n_unread:
        parts.append(f"{task.n_unread} not read yet")
    return ", ".join(parts)


def task_key(project: str, task: str) -> str:
    """A task as it appears in URLs, menus and legends: ``project/task``, one key per task.

    Names may hold "/", so the project's "/" (and "%") are written ``%2F`` (``%25``): the task
    ``x/y`` of project ``col`` is ``col/x/y``, the task ``y`` of project ``col/x`` is
    ``col%2Fx/y``; plain names read as before."""
    return f"{project.replace('%', '%25').replace('/', '%2F')}/{task}"


def run_label(run: RunSummary) -> str:
    """A run as people recognise it: project / task / name (short id). Plain text: use it in
    selectboxes and tables, pass it through ``md`` for Markdown."""
    return f"{run.project} / {run.task} / {run.name} ({run.uid[:8]})"


def status(run: RunSummary, now: datetime | None = None) -> str:
    """A run's status as the API reads it, with "· diverged" after it when its loss diverged
    (``RunSummary.diverged``, a flag beside the lifecycle); a crashed run (the server stopped
    hearing from it without a finish) says when it was last heard from, e.g. "crashed (last
    seen 14:03 UTC, 12 min ago)"."""
    return _lifecycle(run, now) + (" · diverged" if run.diverged else "")


def _lifecycle(run: RunSummary, now: datetime | None) -> str:
    if run.status != "crashed" or run.last_seen_at is None:
        return run.status
    seen = run.last_seen_at.astimezone(timezone.utc)
    ago = max(((now or datetime.now(timezone.utc)) - seen).total_seconds(), 0.0)
    if ago < 90:
        since = f"{ago:.0f} s ago"
    elif ago < 90 * 60:
        since = f"{ago / 60:.0f} min ago"
    elif ago < 36 * 3600:
        since = f"{ago / 3600:.0f} h ago"
    else:
        since = f"{ago / 86400:.0f} days ago"
    return f"crashed (last seen {seen:%Y-%m-%d %H:%M} UTC, {since})"
