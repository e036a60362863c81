"""Arranging the API's answers: text as people read it, marks placed on the x axis, and no
number where the API gives none."""

from __future__ import annotations

import dataclasses
import math
from datetime import datetime, timezone

import pandas as pd
import pytest

from noisescope._results import EventRow, RunSummary
from noisescope.sweep import CriticalBatchReport, TargetResult
from noisescope_dashboard import _frames, _text


def _run(**changes: object) -> RunSummary:
    fields: dict[str, object] = {
        "uid": "u" * 32,
        "project": "p",
        "task": "t",
        "name": "**n**",
        "tags": ["<b>x</b>"],
        "config": {"lr": 0.1},
        "batch_size": 64.0,
        "units": "examples",
        "status": "running",
        "started_at": datetime(2026, 1, 1, tzinfo=timezone.utc),
        "ended_at": None,
        "last_seen_at": None,
        "n_samples": 1000,
        "last_step": 1000,
        "last_examples": 64000.0,
        "last_loss": 0.5234,
        "last_eval_loss": None,
        "batch_in_use": 1860.0,
        "batch_in_use_source": "event",
        "level": 0.9,
        "b_simple": 6200.0,
        "b_simple_lo": 5100.0,
        "b_simple_hi": 7400.0,
        "b_simple_reason": None,
        "g_sq": 1.0,
        "trace_sigma": 6200.0,
        "window_samples": 100,
        "window_first_step": 901,
        "window_last_step": 1000,
        "b_simple_lower": None,
        "window_limit": None,
        "batch_to_b_simple": 0.3,
        "notice": None,
    }
    fields.update(changes)
    return RunSummary(**fields)  # type: ignore[arg-type]


def test_runs_table_writes_numbers_as_people_do() -> None:
    (row,) = _frames.runs_table([_run()]).to_dict("records")
    assert row["batch"] == "1,860"
    assert row["b_simple"] == "6,200"
    assert row["interval"] == "5,100 – 7,400"
    assert row["ratio"] == "0.3×"
    assert row["loss"] == "0.523"
    assert row["step"] == "1,000"
    assert row["name"] == "**n**" and row["tags"] == "<b>x</b>"  # text, as given
    assert row["_b_simple"] == 6200.0


def test_runs_table_gives_no_number_and_no_ratio_when_not_measurable() -> None:
    reason = "not yet measurable: 28 samples so far"
    (row,) = _frames.runs_table(
        [_run(b_simple=None, b_simple_lo=None, b_simple_hi=None, b_simple_reason=reason)]
    ).to_dict("records")
    assert row["b_simple"] == row["interval"] == row["ratio"] == ""
    assert row["why"] == reason
    assert math.isnan(row["_b_simple"]) and math.isnan(row["_ratio"])
    bounded = _run(b_simple=None, b_simple_lo=None, b_simple_hi=None, b_simple_lower=380.0)
    (row,) = _frames.runs_table([bounded]).to_dict("records")
    assert (row["b_simple"], row["why"]) == ("≥ 380", "not yet measurable")
    # the Run page's headline says the same (views/run.py shows a dash for "")
    assert _text.b_simple_now(bounded) == "≥ 380" and _text.b_simple_now(_run()) == "6,200"
    assert _text.no_b_simple_because(_run()) == ""


def test_event_marks_leave_out_evaluations_and_notices() -> None:
    events = [
        EventRow(10, "batch_size", {"old_batch_size": 64, "batch_size": 2048}, 5.0, 1),
        EventRow(20, "eval", {"loss": 0.4}, 6.0, 2),
        EventRow(0, "notice", {"message": "not measuring"}, 1.0, 3),
        EventRow(30, "checkpoint", {"path": "x"}, 7.0, 4),
    ]
    points = pd.DataFrame({"step": [0.0, 40.0], "x": [0.0, 4000.0]})
    marks = _frames.event_marks(events, points, "examples")
    assert marks["label"].tolist() == ["batch size 64 → 2,048", "checkpoint: path=x"]
    assert marks["x"].tolist() == [1000.0, 3000.0]  # placed by the series' own steps
    assert _frames.event_marks(events, points, "time", t0=1.0)["x"].tolist() == [4.0, 6.0]
    evals = _frames.eval_points(events, points, "step")
    assert evals.to_dict("records") == [{"step": 20, "loss": 0.4, "x": 20.0}]


def test_evaluation_points_take_only_numbers_as_the_server_does() -> None:
    """An ``eval`` event's loss (and examples) is read by ``protocol.finite_number``, the rule
    the server's divergence and sweep use: booleans, text and non-finite values are no loss."""
    losses: list[object] = [0.4, True, "0.3", math.nan, math.inf, None, 2]
    events = [EventRow(i, "eval", {"loss": v}, float(i), i) for i, v in enumerate(losses)]
    events.append(EventRow(9, "eval", {"loss": 0.2, "examples": False}, 9.0, 9))
    points = pd.DataFrame({"step": [0.0, 10.0], "x": [0.0, 1000.0]})
    evals = _frames.eval_points(events, points, "examples")
    assert evals["step"].tolist() == [0, 6, 9]
    assert evals["loss"].tolist() == [0.4, 2.0, 0.2]
    assert evals["x"].tolist() == [0.0, 600.0, 900.0]  # examples=False: placed by its step


@pytest.mark.parametrize(
    ("value", "text"),
    [(1860, "1,860"), (2.1e6, "2.1M"), (12, "12"), (18.5, "18.5"), (None, "—")],
)
def test_counts(value: float | None, text: str) -> None:
    assert _text.count(value) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [(0.5234, "0.523"), (2.3145, "2.31"), (1234.5, "1,234"), (1.23e-5, "0.0000123")],
)
def test_losses_never_use_exponents(value: float, text: str) -> None:
    assert _text.loss(value) == text


@pytest.mark.parametrize(
    "hostile",
    ["**x**", "<b>x</b>", "[a](javascript:alert(1))", "`code`", "$x$", "a_b_c", "# h", "~s~"],
)
def test_markdown_escaping_leaves_nothing_to_interpret(hostile: str) -> None:
    escaped = _text.md(hostile)
    special = set("\\`*_{}[]()#+-.!|<>~$:&=\"'")
    i = 0
    while i < len(escaped):  # every special character is preceded by a backslash
        if escaped[i] == "\\":
            i += 2
            continue
        assert escaped[i] not in special, escaped
        i += 1


def test_a_crashed_run_says_when_it_was_last_seen() -> None:
    seen = datetime(2026, 1, 1, 14, 3, tzinfo=timezone.utc)
    crashed = _run(status="crashed", last_seen_at=seen)
    later = datetime(2026, 1, 1, 14, 15, tzinfo=timezone.utc)
    assert (
        _text.status(crashed, now=later) == "crashed (last seen 2026-01-01 14:03 UTC, 12 min ago)"
    )
    assert _text.status(_run(status="running", last_seen_at=seen), now=later) == "running"
    assert _frames.runs_table([crashed])["status"][0].startswith("crashed (last seen 2026-01-01")


def _report(units: str, b_crit: float, b_simple_lo: float) -> CriticalBatchReport:
    target = TargetResult(
        target=1.0,
        points=[],
        runs=[],
        s_min=10.0,
        e_min=1e4,
        b_crit=b_crit,
        b_crit_lo=0.9 * b_crit,
        b_crit_hi=1.1 * b_crit,
        determined=True,
        warnings=[],
        b_simple=b_crit / 2,
        b_simple_lo=b_simple_lo,
        b_simple_hi=b_crit,
        b_simple_reason=None,
    )
    return CriticalBatchReport(
        project="p",
        task=units,
        units=units,
        level=0.9,
        loss_source="eval",
        loss_method="evaluation loss",
        default_targets=True,
        batch_sizes=[],
        n_runs=0,
        excluded=[],
        warnings=[],
        targets=[target],
    )


def test_open_interval_ends_are_drawn_to_their_own_units_axis() -> None:
    """Tokens and examples get one chart each, so an interval reaching 0 is drawn to the edge
    of its own chart, not to a floor set by the other unit's far smaller numbers."""
    points, _ = _frames.tasks_b_simple_vs_b_crit(
        [_report("examples", 200.0, 90.0), _report("tokens", 8000.0, 0.0)]
    )
    tokens = points.set_index("units").loc["tokens"]
    assert tokens["b_simple_lo_shown"] == pytest.approx(4000.0 / 3.0)  # its own smallest / 3
    assert tokens["b_simple_interval"] == "0 – 8,000"


def test_the_what_if_table_reads_steps_as_whole_numbers() -> None:
    """S = S_min (1 + B_crit/B) is a step count: 68.4 steps reads as "68", never "68.4"."""
    from noisescope.recommend import parallelism_plan

    plan = parallelism_plan(100.0, 25.0, s_min=34.2, max_devices=8)
    steps = {r.devices: r.steps for r in plan.rows}
    assert steps[4] == pytest.approx(68.4)
    table = _frames.parallelism_table(plan, "examples")
    assert list(table["steps"]) == [_text.whole(s) for s in steps.values()]
    assert table["steps"][2] == "68"


def test_the_what_if_table_never_rounds_a_doubling_across_the_limit() -> None:
    """Issue 30: the 64-device row's doubling, 1.494x, read "1.5x" on a row past the 1.5x
    limit (now "1.49x"); the table says which rows are past it, by the chart's rule."""
    from noisescope.recommend import parallelism_plan

    plan = parallelism_plan(2000.0, 32.0)
    table = _frames.parallelism_table(plan, "examples").set_index("devices")
    assert table.loc["64", "this doubling"] == "1.49×"
    assert table.loc["32", "this doubling"] == "1.7×"
    assert table.loc["32", "doubling"] == "each doubling pays"
    assert table.loc["64", "doubling"] == "past the limit"
    rows = _frames.parallelism_rows(plan)
    assert list(rows["past"]) == list(table["doubling"])
    assert _text.ratio(1.4996, limit=1.5) == "1.4996×" and _text.ratio(1.5, limit=1.5) == "1.5×"
    assert _text.ratio(1.52, limit=1.5) == "1.5×"  # at the limit pays: the same side


def test_the_task_table_says_how_many_runs_answer_from_older_digests() -> None:
    """``TaskSummary.n_behind``: runs answering as the server stored them seconds ago."""
    from noisescope import TaskSummary

    def task(name: str, n_behind: int, n_unread: int = 0) -> TaskSummary:
        return TaskSummary(
            project="p", task=name, n_runs=3000, n_running=3000, n_samples=600_000,
            batch_sizes=[32.0], units=["examples"], last_started_at=None, n_measured=2950,
            b_simple_median=40.0, b_simple_min=10.0, b_simple_max=90.0, n_behind=n_behind,
            n_unread=n_unread,
        )  # fmt: skip

    table = _frames.task_table(
        [task("exact", 0), task("lagging", 2800), task("new", 50, 50), task("both", 2800, 50)]
    )
    # runs not read yet are told apart: unmeasured here, not runs that measure nothing
    assert list(table["measured runs"]) == [
        "2950 of 3000",
        "2950 of 3000 (2800 as of seconds ago)",
        "2950 of 3000 (50 not read yet)",
        "2950 of 3000 (2750 as of seconds ago, 50 not read yet)",
    ]
    # the caption of a task left undrawn
    unread = dataclasses.replace(task("unread", 2, 2), n_runs=2, n_measured=0)
    assert _text.task_unmeasured(unread) == "0 of 2 runs measured: 2 not read yet"
    assert _text.task_unmeasured(task("none", 0)) == "0 of 3000 runs measured"


def test_the_loss_views_say_why_they_draw_nothing() -> None:
    """Runs with a B_simple but no training loss are not runs without a B_simple."""
    from noisescope_dashboard._compare import nothing_against_loss

    def points(loss: list[float | None], b_simple: list[float | None]) -> pd.DataFrame:
        return pd.DataFrame({"run": "r", "loss": loss, "b_simple": b_simple})

    def why(p: pd.DataFrame, log_loss: bool = False) -> str:
        assert _frames.loss_points(p, log_loss=log_loss).empty
        return nothing_against_loss(p, log_loss=log_loss, who="These runs")

    assert why(points([1.0, None], [None, None])).startswith("These runs have no B_simple yet")
    unlogged = why(points([None, None], [30.0, 40.0]))
    assert "have a B_simple but no training loss" in unlogged and "run.log(loss=" in unlogged
    assert "untick" in why(points([-1.0, 0.0], [30.0, 40.0]), log_loss=True)
    assert "no B_simple yet" in why(points([], []))
    assert len(_frames.loss_points(points([-1.0, 2.0], [30.0, 40.0]), log_loss=False)) == 2
