"""AppTest for every page against a real server: widgets and query parameters drive state,
charts are asserted from their Vega-Lite specs, missing things say "not found", and user text
(names, tags, config, task names) never becomes markup."""

from __future__ import annotations

import dataclasses
import json
from urllib.parse import quote

import pandas as pd
import pytest

from harness import free_port
from harness.broken_http import Answer, BrokenServer
from harness.dashboard_runs import (
    DIGITS64,
    HOSTILE_TASK,
    LM,
    NOTICE,
    NOTICE_MESSAGE,
    SHORT,
    default_runs,
)
from noisescope import Api, TaskSummary
from noisescope_dashboard import _frames, _text

from ._app import chart_data, charts, plain, texts
from ._vega import spec_layers
from .conftest import MakeApp

PAGES = ["runs", "run", "compare_runs", "compare_tasks", "critical_batch", "what_if"]
B_CHART = "B_simple with its 90% interval and the batch in use"


def _layer_marks(spec: dict[str, object]) -> list[str]:
    out = []
    for layer in spec_layers(spec):
        mark = layer["mark"]
        out.append(str(mark["type"] if isinstance(mark, dict) else mark))
    return out


@pytest.mark.parametrize("page", PAGES)
def test_no_server_configured_says_what_to_do(make_app: MakeApp, page: str) -> None:
    at = make_app(None, page)
    (warning,) = at.warning
    assert "noisescope up" in warning.value and "NOISESCOPE_URL" in warning.value
    assert not at.get("vega_lite_chart")


@pytest.mark.parametrize("page", PAGES)
def test_unreachable_server_says_what_to_do(make_app: MakeApp, page: str) -> None:
    at = make_app(f"http://127.0.0.1:{free_port()}", page)
    (error,) = at.error
    assert "Cannot reach the noisescope server" in error.value
    assert "noisescope up" in error.value


@pytest.mark.parametrize("page", PAGES)
def test_a_server_that_sends_no_noisescope_answer_says_so(make_app: MakeApp, page: str) -> None:
    """Issue 29: HTML with 200 (a JSONDecodeError) escaped the pages' ApiError handling."""
    with BrokenServer(Answer(b"<html>a web app</html>", content_type="text/html")) as broken:
        at = make_app(broken.url, page)
    (error,) = at.error
    # Issue 47 item 6: a web page is the dashboard's own URL, most often: say what to use.
    assert "not the noisescope server" in error.value, error.value
    assert "is it the dashboard" in error.value and "default port is 8765" in error.value
    assert "noisescope dashboard --url URL" in error.value


@pytest.mark.parametrize("page", PAGES[:1])
def test_an_answer_that_is_not_json_says_so(make_app: MakeApp, page: str) -> None:
    with BrokenServer(Answer(b"<xml>a web app</xml>", content_type="text/xml")) as broken:
        at = make_app(broken.url, page)
    (error,) = at.error
    assert "cannot read" in error.value and "not JSON" in error.value


def test_empty_server_shows_the_lines_to_add(make_app: MakeApp, empty_server: str) -> None:
    at = make_app(empty_server)
    assert "No runs yet" in at.info[0].value
    code = at.code[0].value
    assert "noisescope.init(" in code and "GradientNoiseProbe(model, run)" in code


def test_app_navigates_all_pages(make_app: MakeApp, server: str) -> None:
    at = make_app(server)
    assert at.title[0].value == "Runs"
    for page, title in [
        ("run", "Run"),
        ("compare_runs", "Compare runs"),
        ("compare_tasks", "Compare tasks"),
        ("critical_batch", "Critical batch size"),
        ("what_if", "What-if"),
    ]:
        at.switch_page(f"views/{page}.py").run()
        assert not at.exception, (page, at.exception)
        assert at.title[0].value == title
        # a chart's title on the page is its description (for screen readers and the PNG)
        assert set(charts(at)) <= {plain(h.value) for h in at.subheader}, page


# --- Runs --------------------------------------------------------------------------------


def test_runs_table_shows_every_run_and_why_some_have_no_number(
    make_app: MakeApp, server: str
) -> None:
    at = make_app(server, "runs")
    table = at.dataframe[0].value.set_index("uid")
    assert len(table) == len(default_runs())
    lm = table.loc[LM]
    assert lm["name"] == "<b>lm</b> **run**"  # shown verbatim, as text
    assert lm["tags"] == "<script>alert(1)</script>, **bold**"
    assert lm["batch"] == "8,192"  # the batch-size change, written as people write it
    digits = table.loc[DIGITS64]
    assert digits["b_simple"] == "100" and digits["ratio"] == "0.64×"
    assert digits["why"] == ""
    for uid in (SHORT, NOTICE):  # not measurable: no number, no ratio, and why
        row = table.loc[uid]
        assert row["b_simple"] == "" and row["interval"] == "" and row["ratio"] == ""
        assert row["why"]
    assert "40 samples" in table.loc[SHORT, "why"]
    assert NOTICE_MESSAGE in table.loc[NOTICE, "why"]
    assert table.loc[NOTICE, "task"] == HOSTILE_TASK


def test_runs_table_filters_search_and_sort(make_app: MakeApp, server: str) -> None:
    at = make_app(server, "runs", task=["digits"], sort="ratio")
    table = at.dataframe[0].value
    assert len(table) == 18
    assert table["_ratio"].is_monotonic_increasing
    at.text_input(key="q").input("b512-lr0.1").run()
    assert at.dataframe[0].value["name"].tolist() == ["digits-b512-lr0.1"]
    at.text_input(key="q").input("nothing-matches").run()
    assert "No run matches" in at.info[0].value


# --- Run ---------------------------------------------------------------------------------


def test_run_page_headline_and_verdict(make_app: MakeApp, server: str, api: Api) -> None:
    at = make_app(server, "run", run=DIGITS64)
    assert at.selectbox(key="_qp_run").value == DIGITS64
    assert at.query_params["run"] == DIGITS64
    metrics = {m.label: m.value for m in at.metric}
    assert metrics == {
        "B_simple now": "100",
        "Batch in use": "64 examples",
        "B / B_simple": "0.64×",
        "Loss": "0.153",
    }
    run = api.run(DIGITS64)
    caption = plain(texts(at))
    assert f"From the last {run.window_samples} samples, steps " in caption
    assert "the same value as the Runs table and the API" in caption
    verdict = api.recommendation(DIGITS64).recommendation.verdict
    assert plain(at.info[0].value) == verdict
    assert verdict.startswith("batch 64 is ~0.64× B_simple")


def test_run_page_unknown_run_is_not_found(make_app: MakeApp, server: str) -> None:
    at = make_app(server, "run", run="no-such-run")
    (error,) = at.error
    assert "no-such-run" in plain(error.value) and "not found" in error.value
    # the navigation is a bar at the top (app.py), never "the menu on the left"
    assert "on the left" not in error.value and "the bar at the top" in error.value
    assert not at.metric and not at.get("vega_lite_chart")
    assert not at.selectbox  # never silently another run


def test_run_page_not_yet_measurable_shows_no_number_and_no_verdict(
    make_app: MakeApp, server: str
) -> None:
    at = make_app(server, "run", run=SHORT)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["B_simple now"] == "—" and metrics["B / B_simple"] == "—"
    (warning,) = at.warning
    assert "no verdict" in warning.value
    # the API's reason as a sentence of its own; the run has finished, so its 40 samples are
    # all it has (issue 47: "40 samples so far" for a finished run)
    assert "no verdict. Not measurable: 40 samples in all" in plain(warning.value)
    assert plain(warning.value).endswith(".")
    assert not at.info  # no verdict


def test_run_page_without_samples_says_why_and_what_to_do(make_app: MakeApp, server: str) -> None:
    at = make_app(server, "run", run=NOTICE)
    warning = plain(at.warning[0].value)
    assert _text.sentence(NOTICE_MESSAGE) in warning
    # a finished run: no "yet", and the reason said once ("no samples yet: no samples yet")
    assert warning.startswith("This run finished with no samples. Its training loop said: ")
    assert "yet" not in warning and warning.count("no samples") == 1
    assert "accumulate_grad_batches" in at.markdown[0].value
    assert not at.metric and not at.get("vega_lite_chart")


def test_run_page_smoothing_changes_the_curves_not_the_headline(
    make_app: MakeApp, server: str
) -> None:
    metrics = []
    curves = []
    for window in ("0", "200"):
        at = make_app(server, "run", run=LM, window=window)
        assert at.number_input(key="window").value == int(window)
        metrics.append({m.label: m.value for m in at.metric})
        (frame,) = [f for f in chart_data(at)[B_CHART] if "what" in f and len(f)][:1]
        curves.append(frame["b_simple"].round(6).tolist())
    assert metrics[0] == metrics[1]
    assert curves[0] != curves[1]


def test_run_page_default_window_is_about_five_percent(make_app: MakeApp, server: str) -> None:
    at = make_app(server, "run", run=LM)
    assert at.number_input(key="window").value == 50  # 5% of 400 steps, at least 50


def test_run_page_charts_legend_events_evals_and_units(make_app: MakeApp, server: str) -> None:
    at = make_app(server, "run", run=LM, x="examples")
    specs = charts(at)
    main = specs[B_CHART]
    assert _layer_marks(main) == ["area", "line", "line", "rule"]
    legend = spec_layers(main)[1]["encoding"]["color"]
    assert legend["scale"]["domain"] == [
        "B_simple",
        "90% interval",
        "batch in use",
        "batch-size change",
        "other event",
    ]
    assert spec_layers(main)[1]["encoding"]["x"]["title"] == "tokens seen"
    assert "tr(Σ) per token: the gradient noise" in specs
    loss = specs["Loss (evaluations as points)"]
    assert _layer_marks(loss) == ["line", "point", "rule"]
    rules = [f for f in chart_data(at)[B_CHART] if "label" in f]
    labels = sorted(set(rules[0]["label"]))
    assert labels == ["batch size 4,096 → 8,192", "checkpoint: path=<b>ckpt</b>"]  # no eval
    per_layer = spec_layers(specs["B_simple per layer"])
    assert per_layer[1]["encoding"]["color"]["field"] == "layer"
    digits = charts(make_app(server, "run", run=DIGITS64))
    assert "tr(Σ) per example: the gradient noise" in digits


def test_run_page_log_axes_read_as_numbers(make_app: MakeApp, server: str) -> None:
    at = make_app(server, "run", run=LM)
    y = spec_layers(charts(at)[B_CHART])[1]["encoding"]["y"]
    assert y["scale"]["type"] == "log"
    assert y["axis"]["format"] == ",~r"
    for value in y["axis"]["values"]:
        mantissa = value / 10 ** len(str(int(value))[1:]) if value >= 1 else value
        assert round(mantissa, 9) in (1, 2, 5) or value < 1


def test_run_page_widgets_update_the_url(make_app: MakeApp, server: str) -> None:
    at = make_app(server, "run", run=DIGITS64)
    at.radio(key="_qp_x").set_value("time").run()
    assert not at.exception
    assert at.query_params["x"] == "time"  # (bound widgets write the URL in the browser)
    assert at.query_params["run"] == DIGITS64
    line = spec_layers(charts(at)[B_CHART])[1]
    assert line["encoding"]["x"]["title"] == "seconds since the first sample"


def test_user_text_is_shown_literally(make_app: MakeApp, server: str) -> None:
    at = make_app(server, "run", run=LM)
    # escaped Markdown: no tag, bold or link survives as markup
    assert at.subheader[0].value == r"\<b\>lm\</b\> \*\*run\*\*"
    caption = at.caption[0].value
    assert r"\<script\>alert\(1\)\</script\>" in caption and r"\*\*bold\*\*" in caption
    assert "<script>" not in texts(at).replace(r"\<script\>", "")
    label = at.selectbox(key="_qp_run")
    assert "<b>lm</b> **run**" in label.format_func(LM)  # selectbox options are plain text


# --- Compare -----------------------------------------------------------------------------


def test_compare_runs_one_chart_per_unit_with_a_clickable_legend(
    make_app: MakeApp, server: str
) -> None:
    at = make_app(server, "compare_runs", runs=[DIGITS64, LM], color="task")
    assert at.multiselect(key="_qp_runs").value == [DIGITS64, LM]
    subheaders = [s.value for s in at.subheader]
    assert "B_simple against loss — runs in examples" in subheaders
    assert "B_simple against loss — runs in tokens" in subheaders
    data = chart_data(at)
    spec = charts(at)["B_simple against loss — runs in tokens"]
    assert spec["encoding"]["x"]["field"] == "loss"
    assert spec["encoding"]["color"]["field"] == "task"
    assert spec["encoding"]["color"]["legend"]["labelLimit"] == 0
    assert spec["params"][0]["bind"] == "legend"
    units = {frozenset(f["units"]) for frames in data.values() for f in frames if "units" in f}
    assert units == {frozenset({"examples"}), frozenset({"tokens"})}  # never mixed
    table = at.dataframe[0].value.set_index("uid")
    assert table.loc[DIGITS64, "b_simple"] == "100"
    # its table is the Runs table's, fewer columns: the same headers and tooltips
    shown = json.loads(at.dataframe[0].proto.columns)
    on_runs = json.loads(make_app(server, "runs").dataframe[0].proto.columns)
    assert list(at.dataframe[0].proto.column_order) == [
        *("name", "task", "batch", "units", "b_simple", "interval", "ratio", "why")
    ]
    for column in at.dataframe[0].proto.column_order:
        config = shown[column]
        assert (config["label"], config.get("help")) == (
            on_runs[column]["label"],
            on_runs[column].get("help"),
        ), column
    assert shown["ratio"]["help"] == "Below 1: a bigger batch would cut steps"


def test_compare_tasks_puts_every_unit_on_one_chart_on_request(
    make_app: MakeApp, server: str, api: Api
) -> None:
    """The paper's figure: tasks in examples and in tokens on one chart, each in its units."""
    at = make_app(server, "compare_tasks")
    at.checkbox(key="together").check().run()
    assert not at.exception
    title = "B_simple against B_crit across tasks in task units"
    specs, data = charts(at), chart_data(at)
    assert not any(t.endswith(("in examples", "in tokens")) for t in specs if "B_crit" in t)
    versus = specs[title]
    assert _layer_marks(versus) == ["line", "rule", "rule", "point"]
    shown = max(data[title], key=len)
    assert set(shown["units"]) == {"examples", "tokens"}
    expected = {
        (f"{r.project}/{r.task}", t.target, t.b_crit)
        for r in (api.critical_batch("vision", "digits"), api.critical_batch("nlp", "lm-sweep"))
        for t in r.targets
        if t.determined and t.b_simple is not None
    }
    assert {(r.task, r.target, r.b_crit) for r in shown.itertuples()} == expected
    linked = make_app(server, "compare_tasks", together="true")  # a link to this view
    assert title in charts(linked)


def test_compare_tasks_as_the_paper_draws_it(make_app: MakeApp, server: str, api: Api) -> None:
    at = make_app(server, "compare_tasks")
    specs, data = charts(at), chart_data(at)
    expected = {
        (f"{r.project}/{r.task}", r.units, t.target, t.b_crit, t.b_simple)
        for r in (api.critical_batch("vision", "digits"), api.critical_batch("nlp", "lm-sweep"))
        for t in r.targets
        if t.determined and t.b_simple is not None
    }
    got = set()
    for units in ("examples", "tokens"):  # one chart per unit: never both on one axis
        versus = specs[f"B_simple against B_crit across tasks in {units}"]
        assert _layer_marks(versus) == ["line", "rule", "rule", "point"]
        _diagonal, x_bars, y_bars, points = spec_layers(versus)
        assert x_bars["encoding"]["x2"]["field"] == "b_crit_hi_shown"
        assert y_bars["encoding"]["y2"]["field"] == "b_simple_hi_shown"
        assert points["encoding"]["x"]["scale"]["type"] == "log"
        assert points["encoding"]["y"]["scale"]["type"] == "log"
        assert points["encoding"]["x"]["title"] == f"B_crit from the sweep fit ({units})"
        shown = max(data[f"B_simple against B_crit across tasks in {units}"], key=len)
        assert set(shown["units"]) == {units}
        got |= {(r.task, r.units, r.target, r.b_crit, r.b_simple) for r in shown.itertuples()}
    assert got == expected
    # one colour per task across every chart of the page (each chart lists its own tasks)
    colour_of: dict[str, set[str]] = {}
    by_chart: dict[str, list[str]] = {}
    for title, spec in specs.items():
        for layer in spec_layers(spec):
            colour = layer.get("encoding", {}).get("color", {})
            if colour.get("field") != "task":
                continue
            scale = colour["scale"]
            assert len(scale["domain"]) == len(scale["range"]), title
            by_chart[title] = scale["domain"]
            for task, value in zip(scale["domain"], scale["range"], strict=True):
                colour_of.setdefault(task, set()).add(value)
    assert len(by_chart) == 2  # against B_crit, in examples and tokens (loss: by batch size)
    assert all(len(values) == 1 for values in colour_of.values()), colour_of
    assert len({next(iter(v)) for v in colour_of.values()}) == len(colour_of)  # tasks apart
    assert "vision/digits" in by_chart["B_simple against B_crit across tasks in examples"]
    assert "nlp/lm-sweep" in by_chart["B_simple against B_crit across tasks in tokens"]
    subheaders = [s.value for s in at.subheader]
    assert {f"B_simple against B_crit across tasks in {u}" for u in ("examples", "tokens")} <= set(
        subheaders
    )
    left_out = at.dataframe[0].value
    assert set(left_out["task"]) == {"nlp/lm", f"vision/{HOSTILE_TASK}"}
    assert "B_simple against loss: nlp/lm-sweep" in [plain(s.value) for s in at.subheader]
    summary = at.dataframe[1].value.set_index("task")
    assert summary.loc["digits", "runs"] == "18"
    assert summary.loc["digits", "measured runs"] == "18 of 18"
    assert summary.loc["digits", "B_simple median"] == "100"
    at.multiselect(key="tasks").set_value(["vision/digits"]).run()
    assert not at.exception
    assert list(at.dataframe[-1].value["task"]) == ["digits"]
    at.multiselect(key="tasks").set_value(["nlp/lm"]).run()  # no determined B_crit: no chart
    assert not at.exception
    assert "No task has a determined critical batch size yet" in at.info[0].value
    assert not [t for t in charts(at) if t.startswith("B_simple against B_crit")]


# --- Critical batch size -----------------------------------------------------------------

DIGITS = quote("vision/digits", safe="")


def test_critical_batch_page_renders_the_report(make_app: MakeApp, server: str) -> None:
    at = make_app(server, "critical_batch", task="vision/digits")
    assert "evaluation loss" in at.markdown[0].value
    table = at.dataframe[0].value
    assert len(table) == 4  # the report's default targets
    assert all(b != "not determined" for b in table["B_crit"])
    sweep = charts(at)["Steps and examples to reach each loss target"]
    assert _layer_marks(sweep) == ["line", "point", "point"]
    _hyperbola, hollow, filled = spec_layers(sweep)
    assert hollow["mark"]["filled"] is False and filled["mark"]["filled"] is True
    frames = chart_data(at)["Steps and examples to reach each loss target"]
    points = pd.concat([f for f in frames if "frontier" in f])
    assert set(points["frontier"]) == {True, False}  # the fit's runs and the others
    versus = charts(at)["B_crit against loss, beside B_simple at the same loss"]
    assert _layer_marks(versus) == ["rule", "line"]
    # a sweep in tokens says tokens, in its title above the chart and in the chart's own
    at = make_app(server, "critical_batch", task="nlp/lm-sweep")
    assert "Steps and tokens to reach each loss target" in charts(at)
    assert "Steps and tokens to reach each loss target" in [h.value for h in at.subheader]


def test_critical_batch_targets_live_in_the_url(make_app: MakeApp, server: str) -> None:
    at = make_app(server, "critical_batch", task="vision/digits", targets="1.0, 0.05, x")
    table = at.dataframe[0].value
    assert table["loss target"].tolist() == ["1", "0.05"]
    row = table.set_index("loss target").loc["0.05"]
    assert row["B_crit"] == "not determined" and row["S_min (steps)"] == ""
    # the warnings in full under the table, where no cell cuts them off
    assert row["warnings"].endswith(" (under the table)")
    assert any(
        "Loss 0.05 (not determined)" in plain(w.value) and "a fit needs at least 3" in w.value
        for w in at.warning
    )
    assert "Not numbers" in at.error[0].value and "x" in at.error[0].value
    at.text_input(key="_qp_targets").input("0.9").run()
    assert at.query_params["targets"] == "0.9"
    assert at.dataframe[0].value["loss target"].tolist() == ["0.9"]


def test_critical_batch_unknown_task_is_not_found(make_app: MakeApp, server: str) -> None:
    at = make_app(server, "critical_batch", task="vision/nope")
    (error,) = at.error
    assert "vision/nope" in plain(error.value) and "not found" in error.value
    assert not at.dataframe


def test_critical_batch_too_few_batch_sizes(make_app: MakeApp, server: str) -> None:
    at = make_app(server, "critical_batch", task="nlp/lm")
    assert "3 or more batch sizes" in at.warning[0].value


def test_critical_batch_hostile_task_name_is_text(make_app: MakeApp, server: str) -> None:
    at = make_app(server, "critical_batch", task=f"vision/{HOSTILE_TASK}")
    assert at.selectbox(key="_qp_task").value == f"vision/{HOSTILE_TASK}"


# --- What-if -----------------------------------------------------------------------------


def test_what_if_renders_the_parallelism_plan(make_app: MakeApp, server: str, api: Api) -> None:
    at = make_app(server, "what_if", task="vision/digits", b="512", step_time="0.3")
    report = api.critical_batch("vision", "digits")
    # issue 47: the lowest target whose fit carries no warning, else the lowest determined one
    determined = [t for t in report.targets if t.determined]
    first = ([t for t in determined if not t.warnings] or determined)[-1]
    assert at.selectbox(key="_qp_source").value == f"bcrit:{first.target:g}"
    assert first.b_crit is not None
    plan = api.parallelism(
        first.b_crit,
        16,
        s_min=first.s_min,
        step_time=0.3,
        min_speedup=1.5,
        units="examples",
        batch_size=512,
        reference="B_crit",
    )
    assert plain(at.info[0].value) == plan.summary
    assert plan.verdict is not None and plain(at.markdown[0].value).endswith(plan.verdict)
    table = at.dataframe[0].value
    assert table["devices"].tolist() == [f"{r.devices:,}" for r in plan.rows]
    assert table["time"].iloc[0].endswith(("s", "min", "h"))
    # one device count for the summary, the metrics, the table and the chart's grey points
    paying = plan.paying_devices
    assert plain(at.info[0].value).startswith(f"Past {paying:,} devices (")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Devices while doubling pays"] == f"{paying:,}"
    past = [r.devices for r in plan.rows if r.past_limit]
    assert past and past[0] == 2 * paying
    shown = table.set_index("devices")["doubling"]
    assert [int(d.replace(",", "")) for d in shown.index[shown == "past the limit"]] == past
    (drawn, *_) = chart_data(at)["Time against compute as devices double"]
    assert drawn.loc[drawn["past"] == "past the limit", "devices"].tolist() == past
    specs = charts(at)
    assert set(specs) == {"Time against compute as devices double", "Speed-up against devices"}
    trade = spec_layers(specs["Time against compute as devices double"])
    assert trade[1]["encoding"]["x"]["scale"]["type"] == "log"
    assert _layer_marks(specs["Time against compute as devices double"]) == [
        "line",
        "point",
        "text",
    ]


def test_what_if_judges_a_batch_size_the_task_uses(make_app: MakeApp, server: str) -> None:
    """Its runs use 16 to 512 (three each); the default batch to judge is one of them, not the
    mean of the middle two (96)."""
    at = make_app(server, "what_if", task="vision/digits")
    assert at.number_input(key="b").value == 64


def test_what_if_median_b_simple_has_no_absolute_steps(make_app: MakeApp, server: str) -> None:
    at = make_app(server, "what_if", task="vision/digits", source="median")
    assert "median current B_simple" in plain(at.caption[0].value)
    # said in the empty cells themselves (issue 47), and above the table
    assert set(at.dataframe[0].value["steps"]) == {_frames.NEEDS_S_MIN}
    assert set(at.dataframe[0].value["time"]) == {_frames.NEEDS_S_MIN}
    assert any("Steps and time stay empty" in c.value for c in at.caption)


def test_what_if_says_runs_the_server_has_not_read_are_not_unmeasurable(
    make_app: MakeApp, server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task list past its read limit leaves some runs unread (``TaskSummary.n_unread``):
    with none measured, the page says so, not "train longer"."""
    answer = Api.tasks

    def unread(self: Api, project: str | None = None) -> list[TaskSummary]:
        tasks = answer(self, project)
        return [
            dataclasses.replace(
                t, n_measured=0, b_simple_median=None, b_simple_min=None, b_simple_max=None,
                n_behind=t.n_runs, n_unread=t.n_runs,
            )
            if (t.project, t.task) == ("nlp", "lm")
            else t
            for t in tasks
        ]  # fmt: skip

    monkeypatch.setattr(Api, "tasks", unread)
    at = make_app(server, "what_if", task="nlp/lm")
    (info,) = at.info
    assert "the server has not read 2 runs of it yet" in plain(info.value), info.value
    assert "train longer" not in info.value


def test_what_if_counts_runs_in_words(make_app: MakeApp, server: str, api: Api) -> None:
    """Issue 30: "the task's 1 measured runs"."""
    (lm,) = [t for t in api.tasks() if (t.project, t.task) == ("nlp", "lm")]
    assert lm.n_measured == 1
    at = make_app(server, "what_if", task="nlp/lm", source="median")
    caption = plain(at.caption[0].value)
    assert "of the task's 1 measured run, as the estimate" in caption


def test_what_if_names_b_simple_when_the_source_is_b_simple(
    make_app: MakeApp, server: str, api: Api
) -> None:
    """A B_simple source is read against B_simple (taken as B_crit), never called B_crit."""
    targets = api.critical_batch("vision", "digits").targets
    at_loss = next(t for t in targets if t.b_simple is not None)
    fit = next(t for t in targets if t.determined)
    for source in ("median", f"bsimple:{at_loss.target:g}"):
        at = make_app(server, "what_if", task="vision/digits", b="512", source=source)
        summary, verdict = plain(at.info[0].value), plain(at.markdown[0].value)
        assert "(B_crit ≈ B_simple = " in summary and "(B_crit = " not in summary, source
        assert "× B_simple" in verdict and "B_crit" not in verdict, source
    at = make_app(server, "what_if", task="vision/digits", b="512", source=f"bcrit:{fit.target:g}")
    assert "(B_crit = " in plain(at.info[0].value)
    assert "× B_crit" in plain(at.markdown[0].value)


def test_what_if_unknown_task_is_not_found(make_app: MakeApp, server: str) -> None:
    at = make_app(server, "what_if", task="x/y")
    assert "x/y" in plain(at.error[0].value) and "not found" in at.error[0].value


# --- Tokens ------------------------------------------------------------------------------


def test_a_project_token_shows_only_that_project(make_app: MakeApp, auth_server: str) -> None:
    import httpx

    from .conftest import ADMIN

    answer = httpx.post(
        f"{auth_server}/api/v1/projects/vision/tokens",
        json={"name": "dashboard-test"},
        headers={"Authorization": f"Bearer {ADMIN}"},
    )
    assert answer.status_code == 201, answer.text
    token = answer.json()["token"]
    at = make_app(auth_server, "runs", token=token)
    assert set(at.dataframe[0].value["project"]) == {"vision"}
    at = make_app(auth_server, "run", token=token, run=LM)  # another project's run
    assert "not found" in at.error[0].value
    at = make_app(auth_server, "runs")
    assert "refused the token" in at.error[0].value and "NOISESCOPE_TOKEN" in at.error[0].value
