"""One right answer, everywhere: every number the pages show is the API's, in the same words.

The same run gives the same current B_simple and interval on the Runs table, the Run page, the
recommendation endpoint and ``GET /runs/{id}``; the Critical batch page shows
``GET /tasks/.../critical-batch``'s B_crit, S_min, E_min and B_simple at each loss; the task
summary is ``GET /tasks``'s.
"""

from __future__ import annotations

import math

from harness.dashboard_runs import DIGITS64, LM, NOTICE, SHORT
from noisescope import Api
from noisescope_dashboard import _text

from ._app import plain, texts
from .conftest import MakeApp


def _same(a: float | None, b: float | None) -> bool:
    if a is None or (isinstance(a, float) and math.isnan(a)):
        return b is None or (isinstance(b, float) and math.isnan(b))
    return a == b


def test_runs_table_is_the_apis_current_b_simple(make_app: MakeApp, server: str, api: Api) -> None:
    at = make_app(server, "runs")
    table = at.dataframe[0].value.set_index("uid")
    runs = api.runs()
    assert set(table.index) == {r.uid for r in runs}
    for listed in runs:
        one = api.run(listed.uid)  # the list and the run endpoint agree
        assert (one.b_simple, one.b_simple_lo, one.b_simple_hi) == (
            listed.b_simple,
            listed.b_simple_lo,
            listed.b_simple_hi,
        )
        row = table.loc[listed.uid]
        assert _same(row["_b_simple"], one.b_simple)
        if one.b_simple is None:
            assert row["b_simple"] == row["ratio"] == ""
            # a bound row ("≥ 380") shows the interval its reason names (issue 47)
            bound = one.b_simple_lower is not None
            assert row["interval"] == (
                _text.interval(one.b_simple_lo, one.b_simple_hi) if bound else ""
            )
            # the API's reason; an ended run's count is all it has (issue 47: not "so far")
            assert row["why"] == _text.no_b_simple_because(one)
            assert one.b_simple_reason is not None
            assert row["why"] == one.b_simple_reason or (
                one.status in ("finished", "failed")
                and ("so far" in one.b_simple_reason or "yet" in one.b_simple_reason)
            )
        else:
            assert row["b_simple"] == _text.count(one.b_simple)
            assert row["interval"] == _text.interval(one.b_simple_lo, one.b_simple_hi)
            assert row["ratio"] == _text.ratio(one.batch_to_b_simple)
        assert row["batch"] == _text.count(one.batch_in_use)


def test_run_page_is_the_apis_current_b_simple(make_app: MakeApp, server: str, api: Api) -> None:
    """Every run with samples (short, long, token and sweep runs, one not yet measurable): the
    headline, its interval, the ratio and the verdict are the run endpoint's and the
    recommendation's, or absent together."""
    runs = [r for r in api.runs() if r.n_samples]
    assert SHORT in {r.uid for r in runs} and {DIGITS64, LM} <= {r.uid for r in runs}
    assert any(r.b_simple is None for r in runs) and any(r.b_simple is not None for r in runs)
    for run in runs:
        at = make_app(server, "run", run=run.uid)
        metrics = {m.label: m.value for m in at.metric}
        assert metrics["B_simple now"] == _text.count(run.b_simple)
        rec = api.recommendation(run.uid).recommendation
        # the endpoint's own number and interval
        assert (rec.b_simple, rec.b_simple_lo, rec.b_simple_hi) == (
            run.b_simple,
            run.b_simple_lo,
            run.b_simple_hi,
        )
        if run.b_simple is not None:
            interval = _text.interval(run.b_simple_lo, run.b_simple_hi)
            assert f"90% interval {interval}" in plain(texts(at))
            assert metrics["B / B_simple"] == _text.ratio(run.batch_to_b_simple)
            assert plain(at.info[0].value) == rec.verdict
        else:
            assert run.b_simple_reason and "not yet measurable" in run.b_simple_reason
            assert metrics["B / B_simple"] == "—" and run.batch_to_b_simple is None
            assert rec.current is None and rec.critical_batch_size is None and not rec.options
            assert "no verdict" in rec.verdict
            assert not at.info  # no verdict on the page
            assert plain(_text.sentence(_text.no_b_simple_because(run))) in plain(texts(at))


def test_smoothing_never_moves_b_simple_now(make_app: MakeApp, server: str, api: Api) -> None:
    expected = _text.count(api.run(LM).b_simple)
    for window in ("0", "10", "400"):
        at = make_app(server, "run", run=LM, window=window)
        assert {m.label: m.value for m in at.metric}["B_simple now"] == expected


def test_critical_batch_page_is_the_apis_report(make_app: MakeApp, server: str, api: Api) -> None:
    for task, units in (("vision/digits", "examples"), ("nlp/lm-sweep", "tokens")):
        report = api.critical_batch(*task.split("/"))
        at = make_app(server, "critical_batch", task=task)
        table = at.dataframe[0].value
        assert table["loss target"].tolist() == [_text.target(t.target) for t in report.targets]
        for cells, t in zip(table.to_dict("records"), report.targets, strict=True):
            assert t.determined
            assert cells["B_crit"] == _text.count(t.b_crit)
            assert cells["B_crit 90% interval"] == _text.interval(t.b_crit_lo, t.b_crit_hi)
            assert cells["S_min (steps)"] == _text.count(t.s_min)
            assert cells[f"E_min ({units})"] == _text.count(t.e_min)
            assert cells["B_simple at this loss"] == _text.count(t.b_simple)


def test_task_summary_is_the_apis(make_app: MakeApp, server: str, api: Api) -> None:
    at = make_app(server, "compare_tasks")
    summary = at.dataframe[-1].value.set_index(["project", "task"])
    for t in api.tasks():
        row = summary.loc[(t.project, t.task)]
        assert row["runs"] == _text.count(t.n_runs)
        assert row["B_simple median"] == _text.count(t.b_simple_median)
        assert row["measured runs"] == _text.task_measured(t) == f"{t.n_measured} of {t.n_runs}"


def test_a_run_without_samples_has_no_number_anywhere(
    make_app: MakeApp, server: str, api: Api
) -> None:
    run = api.run(NOTICE)
    assert run.n_samples == 0 and run.b_simple is None and run.notice
    at = make_app(server, "run", run=NOTICE)
    assert not at.metric
