"""AppTest for every page: widgets and query parameters drive state, charts are asserted from
their Vega-Lite specs, and user text (names, tags, config) never becomes markup."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from noisescope_dashboard._charts import spec_layers

from ._synth import DIGITS_B_CRIT

MakeApp = Callable[..., AppTest]
DIGITS64 = "digits0064" + "0" * 22
LM = "lm" + "0" * 30


def charts(at: AppTest) -> dict[str, dict[str, Any]]:
    """Vega-Lite specs of the page's charts by title."""
    out = {}
    for element in at.get("vega_lite_chart"):
        spec = json.loads(element.proto.spec)
        out[str(spec.get("title"))] = spec
    return out


def chart_data(at: AppTest) -> dict[str, list[pd.DataFrame]]:
    """The data frames each chart ships to the browser (Streamlit sends them as Arrow)."""
    import pyarrow as pa

    out = {}
    for element in at.get("vega_lite_chart"):
        title = str(json.loads(element.proto.spec).get("title"))
        out[title] = [
            pa.ipc.open_stream(ds.data.data).read_all().to_pandas() for ds in element.proto.datasets
        ]
    return out


def texts(at: AppTest) -> str:
    parts = [
        e.value
        for kind in ("markdown", "caption", "info", "warning", "error")
        for e in at.get(kind)
    ]
    return "\n".join(str(p) for p in parts)


def test_no_database_configured_says_what_to_do(make_app: MakeApp) -> None:
    at = make_app(None, "runs")
    assert not at.exception
    assert "noisescope up" in at.warning[0].value


def test_empty_database_shows_the_lines_to_add(make_app: MakeApp, empty_db: str) -> None:
    at = make_app(empty_db)
    assert not at.exception
    assert "No runs yet" in at.info[0].value
    code = at.code[0].value
    assert "noisescope.init(" in code and "GradientNoiseProbe(model, run)" in code
    assert "probe.step(" in code


def test_app_navigates_all_pages(make_app: MakeApp, synth_db: str) -> None:
    at = make_app(synth_db)
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


def test_runs_table_filters_search_and_sort(make_app: MakeApp, synth_db: str) -> None:
    at = make_app(synth_db, "runs")
    assert not at.exception
    table = at.dataframe[0].value
    assert len(table) == 7
    lm = table[table["uid"] == LM].iloc[0]
    assert lm["name"] == "<b>lm</b> **run**"  # shown verbatim, as text
    assert lm["tags"] == "<script>alert(1)</script>"
    digits = table[table["task"] == "digits"]
    assert digits["b_simple"].tolist() == pytest.approx([100.0] * 6)
    assert sorted(digits["ratio"].tolist()) == pytest.approx(
        [b / 100 for b in (16, 32, 64, 128, 256, 512)]
    )

    at = make_app(synth_db, "runs", task=["digits"], sort="ratio")
    table = at.dataframe[0].value
    assert len(table) == 6
    assert table["ratio"].is_monotonic_increasing
    at.text_input(key="q").input("b512").run()
    assert at.dataframe[0].value["name"].tolist() == ["digits-b512"]
    at.text_input(key="q").input("nothing-matches").run()
    assert "No run matches" in at.info[0].value


def test_run_page_restores_state_from_the_url(make_app: MakeApp, synth_db: str) -> None:
    at = make_app(synth_db, "run", run=DIGITS64, x="seen", logy="false")
    assert not at.exception
    assert at.selectbox(key="_qp_run").value == DIGITS64
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["B_simple (latest window)"] == "100"
    assert metrics["Batch in use"] == "64"
    assert metrics["B / B_simple"] == "0.64×"
    assert "batch 64 is ~0.6× B_simple" in at.info[0].value
    specs = charts(at)
    b_chart = specs["B_simple = tr(Σ) / |G|² with its interval"]
    marks = [layer["mark"]["type"] for layer in spec_layers(b_chart)]
    assert marks == ["area", "line", "line"]  # band, B_simple, batch in use (no events)
    line = spec_layers(b_chart)[1]
    assert line["encoding"]["x"]["field"] == "examples"
    assert line["encoding"]["y"]["scale"].get("type", "linear") == "linear"
    assert set(specs) >= {"Loss", "Learning rate", "|G|²: true-gradient norm² (unbiased)"}
    # ≤ 2000 points per series reach the browser
    shipped = chart_data(at)
    assert max(len(f) for frames in shipped.values() for f in frames) == 600  # one per step
    assert all(len(f) <= 2000 for frames in shipped.values() for f in frames)


def test_run_page_widgets_update_the_url(make_app: MakeApp, synth_db: str) -> None:
    at = make_app(synth_db, "run", run=DIGITS64)
    at.selectbox(key="_qp_smooth").select("ema").run()
    at.radio(key="_qp_x").set_value("time").run()
    assert not at.exception
    assert at.query_params["smooth"] == "ema"
    assert at.query_params["x"] == "time"
    assert at.query_params["run"] == DIGITS64
    line = spec_layers(charts(at)["B_simple = tr(Σ) / |G|² with its interval"])[1]
    assert line["encoding"]["x"]["field"] == "time"
    assert line["encoding"]["y"]["scale"]["type"] == "log"


def test_run_page_layers_events_and_text_safety(make_app: MakeApp, synth_db: str) -> None:
    at = make_app(synth_db, "run", run=LM, x="seen")
    assert not at.exception
    specs = charts(at)
    main = spec_layers(specs["B_simple = tr(Σ) / |G|² with its interval"])
    assert main[-1]["mark"]["type"] == "rule"  # the batch-size change at step 200
    assert main[1]["encoding"]["x"]["field"] == "tokens"
    per_layer = spec_layers(specs["B_simple per layer"])
    assert per_layer[1]["encoding"]["color"]["field"] == "layer"
    # the name is escaped markdown: no tag and no bold survive as markup
    assert at.subheader[0].value == r"\<b\>lm\</b\> \*\*run\*\*"
    assert "\\<script\\>" in texts(at)
    assert "<script>" not in texts(at).replace("\\<script\\>", "")


def test_compare_runs(make_app: MakeApp, synth_db: str) -> None:
    at = make_app(synth_db, "compare_runs", runs=[DIGITS64, LM], color="task")
    assert not at.exception
    assert at.multiselect(key="_qp_runs").value == [DIGITS64, LM]
    specs = charts(at)
    vs_loss = specs["B_simple against loss (loss falls to the right)"]
    assert vs_loss["encoding"]["x"]["field"] == "loss"
    assert vs_loss["encoding"]["color"]["field"] == "task"
    assert vs_loss["params"][0]["bind"] == "legend"
    assert specs["B_simple against training progress"]["encoding"]["x"]["field"] == "progress"
    tasks = at.dataframe[0].value
    assert sorted(tasks["task"]) == ["digits", "lm"]


def test_compare_tasks_one_colour_per_task(make_app: MakeApp, synth_db: str) -> None:
    at = make_app(synth_db, "compare_tasks", px="step")
    assert not at.exception
    spec = charts(at)["B_simple against training progress"]
    assert spec["encoding"]["color"]["field"] == "task"
    assert spec["encoding"]["x"]["field"] == "step"
    (rows,) = chart_data(at)["B_simple against training progress"]
    assert set(rows["task"]) == {"vision/digits", "nlp/lm"}
    summary = at.dataframe[0].value.set_index("task")
    assert summary.loc["digits", "runs"] == 6
    assert summary.loc["digits", "B_simple (median, latest)"] == pytest.approx(100.0)
    at.multiselect(key="tasks").set_value(["vision/digits"]).run()
    assert list(at.dataframe[0].value["task"]) == ["digits"]


def test_critical_batch_fits_the_sweep(make_app: MakeApp, synth_db: str) -> None:
    at = make_app(synth_db, "critical_batch", task="vision/digits", targets="1.0, 0.6, 0.01")
    assert not at.exception
    fits = at.dataframe[0].value
    assert fits["loss target"].tolist() == [1.0, 0.6]
    assert fits["B_crit"].tolist() == pytest.approx([DIGITS_B_CRIT] * 2, rel=0.05)
    # 0.01 is below every run's loss: it is explained, not fitted
    warnings = [w.value.replace("\\", "") for w in at.warning]
    assert any("loss 0.01" in w and "at least 3" in w for w in warnings), warnings
    specs = charts(at)
    versus = specs["B_crit against loss, with B_simple at the same loss"]
    assert versus["encoding"] if "encoding" in versus else spec_layers(versus)
    rows = pd.concat(chart_data(at)["B_crit against loss, with B_simple at the same loss"])
    assert set(rows["quantity"]) == {"B_crit (fit)", "B_simple (measured, median over runs)"}
    sweep = specs["Steps vs examples per loss target, fitted S-E model"]
    assert [layer["mark"]["type"] for layer in spec_layers(sweep)] == ["line", "point"]


def test_critical_batch_too_few_batch_sizes(make_app: MakeApp, synth_db: str) -> None:
    at = make_app(synth_db, "critical_batch", task="nlp/lm")
    assert not at.exception
    assert "3 or more batch sizes" in at.warning[0].value


def test_what_if_batch_and_gpus(make_app: MakeApp, synth_db: str) -> None:
    at = make_app(synth_db, "what_if", task="vision/digits", b="400")
    assert not at.exception
    metrics = {m.label: m.value for m in at.metric}
    b_crit = float(at.caption[0].value.split("=")[1].split()[0])
    assert b_crit == pytest.approx(DIGITS_B_CRIT, rel=0.05)
    assert metrics["Steps / minimum"] == f"{1 + b_crit / 400:.2f}×"
    assert metrics["Examples / minimum"] == f"{1 + 400 / b_crit:.2f}×"
    trade = charts(at)["Time/compute trade-off (science.md model)"]
    point = spec_layers(trade)[1]
    assert point["mark"]["type"] == "point"
    at.radio(key="_qp_mode").set_value("gpus").run()
    at.number_input(key="gpus").set_value(4).run()
    at.number_input(key="per_gpu").set_value(50).run()
    assert {m.label: m.value for m in at.metric}["Batch"] == "200"
    assert "~1× B_crit" in at.info[0].value


def test_png_and_csv_downloads_render_offline() -> None:
    import pandas as pd

    from noisescope_dashboard import _charts, _ui

    frame = pd.DataFrame({"step": [1, 2], "g_sq": [1.0, 2.0]})
    png = _ui._png(_charts.metric_chart(frame, x="step", y="g_sq", title="|G|²"))
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert _ui._csv(frame).splitlines() == ["step,g_sq", "1,1.0", "2,2.0"]
    # Compare charts hold up to 400 points per run x many runs: more than Altair's 5000-row
    # guard, which is active outside a Streamlit render
    many = pd.DataFrame(
        {"task": ["t"] * 6000, "run": ["r"] * 6000, "loss": range(1, 6001), "b_simple": 1.0}
    )
    png = _ui._png(_charts.compare_chart(many, x="loss", title="many"))
    assert png[:4] == b"\x89PNG"
