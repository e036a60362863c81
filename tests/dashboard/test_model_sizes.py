"""Compare runs by model size against a real server: two branched runs of one task naming
their size in ``config["n_params"]`` (``harness.model_sizes``), and a token run naming it in
``config["model_size"]``."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import noisescope
from harness import ServerProcess
from harness.model_sizes import BRANCH_STEPS, PROJECT, SIZES, post_model_sizes
from harness.payloads import columns, log_sample_args
from noisescope import Api
from noisescope_dashboard import _sizes

from ._app import chart_data, charts, plain, texts
from .conftest import MakeApp

EXAMPLES_TITLE = _sizes.TITLE + " — runs in examples"
TOKENS_TITLE = _sizes.TITLE + " — runs in tokens"


def _token_run(url: str, tmp: Path) -> str:
    run = noisescope.init(
        url,
        project=PROJECT,
        task="lm",
        name="lm",
        config={"model_size": "7B"},
        batch_size=4096,
        units="tokens",
        dir=tmp / "spool",
        quiet=True,
    )
    cols = columns(200, start=300)  # resumed at step 300: its window is 10% of 200 steps
    for i, step in enumerate(cols["step"]):
        run.log_sample(
            *log_sample_args(cols, i), examples=cols["examples"][i], loss=3.0 / (1.0 + step / 50.0)
        )
    run.finish()
    return run.id


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    tmp: Path = tmp_path_factory.mktemp("sizes")
    with ServerProcess() as server:
        ids = post_model_sizes(server.url, tmp)
        ids["lm"] = _token_run(server.url, tmp)
        yield server.url, ids


def _shipped(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """The rows a chart draws (each layer ships its own subset of the page's frame)."""
    return pd.concat(frames, ignore_index=True).drop_duplicates(
        subset=["run", "quantity", "step", "loss", "value"]
    )


def _assert_smoothed_like_the_comparison(
    api: Api, curve: pd.DataFrame, run_id: str, windows: dict[str, float]
) -> None:
    smoothed = api.series(run_id, x="step", window=windows[run_id]).points
    by_step = {p.step_hi: p.b_simple for p in smoothed}
    assert len(curve) > 10
    assert list(curve["value"]) == pytest.approx([by_step[s] for s in curve["step"]])


def test_compare_runs_draws_b_simple_and_local_b_crit_per_model_size_against_loss(
    make_app: MakeApp, stack: tuple[str, dict[str, str]]
) -> None:
    url, ids = stack
    at = make_app(url, "compare_runs", runs=list(ids.values()))
    specs = charts(at)
    assert EXAMPLES_TITLE in specs and TOKENS_TITLE in specs, list(specs)
    frames = chart_data(at)
    shipped = _shipped(frames[EXAMPLES_TITLE])
    assert set(shipped["units"]) == {"examples"}  # never on one axis with the token run
    assert set(_shipped(frames[TOKENS_TITLE])["size"]) == {"7B"}
    assert set(shipped["size"]) == {f"{d} params" for d in SIZES.values()}
    api = Api(url)
    # the B_simple lines are smoothed over the window the comparison charts above used
    compared = api.compare(list(ids.values()), window_fraction=0.1)
    windows = {s.run_uid: s.window_steps for s in compared}
    for name in SIZES:
        points = api.branches(ids[name]).points
        assert [p.step for p in points] == list(BRANCH_STEPS)
        mine = shipped[shipped["run"] == ids[name]]
        drawn = mine[mine["quantity"] != _sizes.B_SIMPLE].sort_values("step")
        assert list(drawn["step"]) == list(BRANCH_STEPS)
        for p, (_, row) in zip(points, drawn.iterrows(), strict=True):
            assert row["loss"] == pytest.approx(p.parent_loss)  # at the parent's eval loss
            if p.b_crit is not None:
                assert row["quantity"] == _sizes.LOCAL
                assert row["value"] == pytest.approx(p.b_crit)
                assert row["lo"] == pytest.approx(p.b_crit_lo)
            else:
                assert row["quantity"] == _sizes.LOWER and pd.isna(row["hi"])
                assert row["value"] == pytest.approx(p.b_crit_lo)
        curve = mine[mine["quantity"] == _sizes.B_SIMPLE]
        assert len(curve) > 10 and curve["lo"].notna().any() and curve["loss"].notna().all()
        _assert_smoothed_like_the_comparison(api, curve, ids[name], windows)
    lm = _shipped(frames[TOKENS_TITLE])
    _assert_smoothed_like_the_comparison(
        api, lm[lm["quantity"] == _sizes.B_SIMPLE], ids["lm"], windows
    )
    spec = specs[EXAMPLES_TITLE]
    assert [layer["mark"]["type"] for layer in spec["layer"]] == ["area", "line", "rule", "point"]
    line = spec["layer"][1]["encoding"]
    assert line["x"]["field"] == "loss" and line["x"]["scale"]["reverse"] is True
    assert line["color"]["title"] == "model size"
    assert line["color"]["scale"]["domain"] == ["16 params", "64 params"]  # smallest first
    assert line["color"]["legend"]["labelLimit"] == 0
    assert line["y"]["title"] == "batch size (examples)"
    assert "`n_params`" in texts(at) and "else the run's name" in plain(texts(at))


def test_on_the_examples_axis_each_branch_point_sits_at_the_examples_its_parent_had_seen(
    make_app: MakeApp, stack: tuple[str, dict[str, str]]
) -> None:
    url, ids = stack
    at = make_app(url, "compare_runs", runs=list(ids.values()), sx="examples", logx="true")
    title = _sizes.TITLE_SEEN.format("examples") + " — runs in examples"
    specs = charts(at)
    assert title in specs and _sizes.TITLE_SEEN.format("tokens") + " — runs in tokens" in specs
    shipped = _shipped(chart_data(at)[title])
    api = Api(url)
    for name in SIZES:
        points = api.branches(ids[name]).points
        assert all(p.parent_examples is not None for p in points)
        drawn = shipped[(shipped["run"] == ids[name]) & (shipped["quantity"] != _sizes.B_SIMPLE)]
        assert sorted(drawn["examples"]) == pytest.approx(
            sorted(float(p.parent_examples or 0) for p in points)
        )
    x = specs[title]["layer"][1]["encoding"]["x"]
    assert x["field"] == "examples" and x["title"] == "examples seen"
    assert x["scale"]["type"] == "log" and not x["scale"].get("reverse")
    assert "at the examples the parent had seen by that step" in plain(texts(at))


def test_runs_without_a_size_or_branches_get_no_chart_and_a_hint(
    make_app: MakeApp, stack: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    url, _ = stack
    plain_run = noisescope.init(
        url, project=PROJECT, task="bare", name="bare", dir=tmp_path / "spool", quiet=True
    )
    cols = columns(50)
    for i in range(len(cols["step"])):
        plain_run.log_sample(*log_sample_args(cols, i))
    plain_run.finish()
    at = make_app(url, "compare_runs", runs=[plain_run.id])
    assert not any(t.startswith(_sizes.TITLE) for t in charts(at))
    assert "are also drawn by model size" in plain(texts(at))


def test_the_legend_names_the_size_from_n_params_then_model_size_then_the_name(
    stack: tuple[str, dict[str, str]],
) -> None:
    url, ids = stack
    run = replace(Api(url).run(ids["lm"]), name="my run")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"n_params": 125_000_000}, "125M params"),
        ({"model_size": "1B"}, "1B"),
        ({"n_params": True, "model_size": " "}, "my run"),
        ({"n_params": -5, "model_size": 1.5}, "1.5"),
        ({"n_params": "125M"}, "125M"),
        ({}, "my run"),
    ]
    for config, label in cases:
        assert _sizes.size_label(replace(run, config=config)) == label
