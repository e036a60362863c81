"""Issue 47, items 1 to 5: what a researcher sees first after a sweep. What-if opens on a
swept task at a target without warnings, Compare runs leaves diverged and short runs out until
asked, the terminal's sweep and the Critical batch size page read a sweep at the same targets,
the per-target table comes before the warnings (folded when long), the Runs table keeps its
reason in view and a bound row's interval, Compare tasks draws bands per batch size, and
What-if says why its steps and time are empty."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import ServerProcess
from harness.dashboard_runs import SHORT, insert_runs, sweep_runs
from noisescope import Api, RunSummary, sweep
from noisescope_dashboard import _frames, _text, _ui

from ._app import charts, plain
from ._vega import spec_layers
from .conftest import MakeApp

#: Targets the declared sweep names in its runs' configs (reachable by every synthetic run).
DECLARED = [1.0, 0.8]


def _marks(spec: dict[str, object]) -> list[str]:
    out = []
    for layer in spec_layers(spec):
        mark = layer["mark"]
        out.append(str(mark["type"] if isinstance(mark, dict) else mark))
    return out


def _order(at: object) -> list[str]:
    """The page's elements in the order shown, by type (blocks opened)."""
    out: list[str] = []

    def walk(node: object) -> None:
        kind = getattr(node, "type", "")
        out.append(str(kind))
        for child in getattr(node, "children", {}).values():
            walk(child)

    walk(at.main)  # type: ignore[attr-defined]
    return out


# --- item 1 ------------------------------------------------------------------------------


def test_what_if_opens_on_a_swept_task_at_a_target_without_warnings(
    make_app: MakeApp, server: str, api: Api
) -> None:
    at = make_app(server, "what_if")
    key = str(at.selectbox(key="_qp_task").value)
    project, task = key.split("/", 1)
    assert next(t for t in api.tasks() if (t.project, t.task) == (project, task)).swept
    report = api.critical_batch(project, task)
    determined = [t for t in report.targets if t.determined]
    clean = [t for t in determined if not t.warnings]
    expected = (clean or determined)[-1]  # the lowest target without warnings, if any
    assert at.selectbox(key="_qp_source").value == f"bcrit:{expected.target:g}"
    assert bool(at.warning) == bool(expected.warnings)  # "read this B_crit with care"


def test_compare_runs_leaves_short_and_diverged_runs_out_until_asked(
    make_app: MakeApp, server: str
) -> None:
    at = make_app(server, "compare_runs")
    picker = at.multiselect(key="_qp_runs")
    short_label = f"lm-short ({SHORT[:8]})"  # options are the labels shown
    assert not any(short_label in o for o in picker.options) and SHORT not in picker.value
    assert len(picker.value) == 5
    # the short run and the run that measured nothing (0 samples)
    assert any("Not offered: 2 runs under 64 samples" in c.value for c in at.caption)
    at.checkbox(key="all").check().run()  # one click shows them
    assert not at.exception
    assert any(short_label in o for o in at.multiselect(key="_qp_runs").options)


def test_diverged_and_short_runs_are_left_out_and_ended_runs_say_in_all(api: Api) -> None:
    short = api.run(SHORT)
    assert short.status == "finished" and short.n_samples < 64
    assert _frames.left_out_why(short) == "under 64 samples"
    assert (
        _frames.left_out_why(dataclasses.replace(short, diverged=True, n_samples=500)) == "diverged"
    )
    assert _frames.left_out_why(dataclasses.replace(short, n_samples=500)) is None
    assert short.b_simple_reason is not None and "samples so far" in short.b_simple_reason
    assert "40 samples in all" in _text.no_b_simple_because(short)
    assert "not yet" not in _text.no_b_simple_because(short)
    running = dataclasses.replace(short, status="running")
    assert _text.no_b_simple_because(running) == short.b_simple_reason


# --- item 2 ------------------------------------------------------------------------------


def test_declared_targets_are_the_runs_common_ones() -> None:
    key = sweep.TARGETS_CONFIG_KEY
    assert sweep.declared_targets([{key: [0.5, 1, 0.3]}, {key: (1.0, 0.3, 0.5)}]) == [1, 0.5, 0.3]
    assert sweep.declared_targets([{key: [1.0]}, {"lr": 0.1}]) == [1.0]  # a run without: fine
    assert sweep.declared_targets([{key: [1.0]}, {key: [0.5]}]) == []  # disagree: defaults
    assert sweep.declared_targets([{key: "1.0"}]) == []
    assert sweep.declared_targets([{key: [1.0, -1.0]}]) == []
    assert sweep.declared_targets([{"lr": 0.1}]) == []


def test_the_sweep_cli_declares_the_targets_it_analyses_at() -> None:
    """``python -m experiments`` analyses each task at ``spec.loss_targets`` and logs them in
    every run's config, where the pages read them (``sweep.declared_targets``)."""
    from experiments.runner import logged_config
    from experiments.tasks import TASKS

    for spec in TASKS.values():
        configs = [logged_config(spec, {"lr": lr}, Path("runs")) for lr in (0.1, 0.2)]
        assert sweep.declared_targets(configs) == sorted(spec.loss_targets, reverse=True)


@pytest.fixture(scope="module")
def declared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server on the digits sweep whose runs name their targets, as the CLI's do."""
    path = Path(tmp_path_factory.mktemp("dash_declared")) / "noisescope.db"
    url = f"sqlite:///{path}"
    runs = [r for r in sweep_runs() if r.task == "digits"]
    for r in runs:
        r.config = {**r.config, sweep.TARGETS_CONFIG_KEY: DECLARED}
    insert_runs(url, runs)
    with ServerProcess(url) as proc:
        yield proc.url


def test_the_pages_read_a_sweep_at_its_declared_targets(
    make_app: MakeApp, declared_server: str, api: Api
) -> None:
    """The CLI's targets and numbers: the page's default targets are the declared ones, and
    its B_crit are the analysis at them (the CLI's, ``tests/experiments/test_quick_e2e``)."""
    undeclared = api.critical_batch("vision", "digits")  # the same runs, naming no targets
    assert [t.target for t in undeclared.targets] != DECLARED  # so the test can tell
    with Api(declared_server) as declared_api:
        at_declared = declared_api.critical_batch("vision", "digits", targets=DECLARED)
        server_defaults = declared_api.critical_batch("vision", "digits")
    # issue 56 item 2: the API's defaults are the declared targets too (one rule everywhere)
    assert server_defaults.default_targets
    assert [t.target for t in server_defaults.targets] == DECLARED
    assert [t.b_crit for t in server_defaults.targets] == [t.b_crit for t in at_declared.targets]
    at = make_app(declared_server, "critical_batch", task="vision/digits")
    assert at.text_input(key="_qp_targets").value == "1, 0.8"
    table = at.dataframe[0].value
    assert table["loss target"].tolist() == ["1", "0.8"]
    assert table["B_crit"].tolist() == [_text.count(t.b_crit) for t in at_declared.targets]
    assert any("python -m experiments" in c.value for c in at.caption)
    what_if = make_app(declared_server, "what_if")
    options = what_if.selectbox(key="_qp_source").options
    assert [o for o in options if o.startswith("B_crit")] == [
        f"B_crit at loss {_text.target(t.target)} (sweep fit): {_text.count(t.b_crit)} examples"
        for t in at_declared.targets
    ]


# --- item 3 ------------------------------------------------------------------------------


def test_the_per_target_table_comes_before_the_warnings_which_fold(
    make_app: MakeApp, server: str
) -> None:
    at = make_app(server, "critical_batch", task="vision/digits", targets="1, 0.05, 0.04")
    order = _order(at)
    assert order.index("dataframe") < order.index("expander")
    assert "warning" not in order[: order.index("dataframe")]
    (folded,) = at.expander
    assert folded.label.startswith(":warning: 3 warnings: Loss 1; Loss 0\\.05 (not determined)")
    assert len(folded.label) < 160  # one line
    assert len(folded.warning) == 3  # the warnings in full, behind it
    table = at.dataframe[0].value
    assert all(w.endswith(" (under the table)") for w in table["warnings"])
    assert "frontier (batch → lr, steps)" not in table.columns
    frontier = at.dataframe[1].value  # the frontier, a row per target and batch size
    assert set(frontier["loss target"]) == {"1"}
    assert len(frontier) == 6


def test_warnings_read_as_words() -> None:
    assert _frames.warnings_cell(0) == ""
    assert _frames.warnings_cell(1) == "1 warning (under the table)"
    assert _frames.warnings_cell(2) == "2 warnings (under the table)"
    line = _ui.warnings_summary(
        ["runs diverged: a, b, c", "loss 1: lr at the grid's edge; more", "x" * 300]
    )
    assert line.startswith("3 warnings: runs diverged; loss 1") and len(line) < 130


def test_runs_table_keeps_the_reason_in_view_and_a_bound_its_interval(api: Api) -> None:
    # issue 56 item 7 (changed from issue 47's reason right after the interval): the answer's
    # columns first, then the reason, whole
    order = list(_ui.RUN_COLUMNS)
    answer = ["b_simple", "interval", "batch", "ratio", "loss", "step", "tags"]
    assert order[order.index("b_simple") : order.index("why")] == answer
    run = api.run(SHORT)
    bound: RunSummary = dataclasses.replace(
        run, b_simple=None, b_simple_lower=44.7, b_simple_lo=44.7, b_simple_hi=167.0
    )
    row = _frames.runs_table([bound]).iloc[0]
    assert (row["b_simple"], row["interval"]) == ("≥ 44.7", "44.7 – 167")


# --- item 4 ------------------------------------------------------------------------------


def test_compare_tasks_draws_a_median_and_band_per_batch_size(
    make_app: MakeApp, server: str
) -> None:
    at = make_app(server, "compare_tasks", tasks=["vision/digits"])
    specs = charts(at)
    versus = specs["B_simple against B_crit across tasks in examples"]
    assert versus["width"] == "container"
    # issue 56 item 8: the medians alone by default (six bands overlapped into one smear); the
    # bands on request
    assert _marks(specs["B_simple against loss: vision/digits"]) == ["line"]
    at.checkbox(key="bands").check().run()
    band = charts(at)["B_simple against loss: vision/digits"]
    assert _marks(band) == ["area", "line"]
    area, median = spec_layers(band)
    assert (
        area["encoding"]["y2"]["field"] == "hi" and median["encoding"]["color"]["field"] == "group"
    )
    assert median["encoding"]["color"]["sort"] == [
        f"batch {b}" for b in (16, 32, 64, 128, 256, 512)
    ]
    at.checkbox(key="each").check().run()  # individual runs on demand
    assert not at.exception
    assert _marks(charts(at)["B_simple against loss: vision/digits"]) == ["area", "line", "line"]
    at.radio(key="_qp_by").set_value("lr").run()
    assert not at.exception
    lr_chart = charts(at)["B_simple against loss: vision/digits"]
    assert spec_layers(lr_chart)[-1]["encoding"]["color"]["sort"] == [
        "lr 0.05",
        "lr 0.1",
        "lr 0.4",
    ]


# --- item 5 ------------------------------------------------------------------------------


def test_what_if_says_why_time_is_empty_and_draws_lines_in_its_legend(
    make_app: MakeApp, server: str
) -> None:
    at = make_app(server, "what_if", task="vision/digits")
    table = at.dataframe[0].value
    assert set(table["time"]) == {_frames.NEEDS_STEP_TIME}
    assert all(s and s != _frames.NEEDS_S_MIN for s in table["steps"])
    assert any("until a step time is entered" in plain(c.value) for c in at.caption)
    speedup = charts(at)["Speed-up against devices"]
    (line,) = spec_layers(speedup)
    for channel in ("color", "strokeDash"):
        assert line["encoding"][channel]["legend"]["symbolType"] == "stroke"
