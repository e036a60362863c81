"""Issue 56 (the first hour, round 2): the pages a new user opens after the README's steps.
A live Run page reads its run once per render, so its headline and verdict agree."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from harness import ServerProcess
from harness.dashboard_runs import DIGITS64, LM, SHORT, default_runs, insert_runs
from noisescope import Api
from noisescope.recommend import recommend
from noisescope_dashboard import _text

from ._app import charts, plain, texts
from .conftest import MakeApp

# --- item 4: one read per render ------------------------------------------------------------


def test_the_run_page_verdict_comes_from_the_read_its_headline_shows(
    make_app: MakeApp, server: str, api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The verdict is made from the same ``RunSummary`` as B_simple now and B / B_simple (a
    second request, as the page made before, reads a live run later and can disagree)."""

    def second_read(self: Api, run_id: str, **kwargs: object) -> None:
        raise AssertionError("the Run page asked the server for a second B_simple")

    monkeypatch.setattr(Api, "recommendation", second_read)
    at = make_app(server, "run", run=DIGITS64)
    run = api.run(DIGITS64)
    assert run.batch_in_use is not None
    verdict = plain(at.info[0].value)
    assert verdict == recommend(run, run.batch_in_use, units=run.units).verdict
    assert f"~{_text.ratio(run.batch_to_b_simple)} B_simple" in verdict


# --- item 5: the ids the pages show are taken everywhere --------------------------------------


def test_the_run_page_opens_on_a_unique_start_of_an_id(make_app: MakeApp, server: str) -> None:
    at = make_app(server, "run", run=DIGITS64[:10])  # "digits00" starts several
    assert not at.error
    assert f"run id {DIGITS64}" in plain(at.caption[0].value)


# --- item 8: Compare tasks charts what was measured, and its summary whole -------------------


@pytest.fixture(scope="module")
def lonely_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The synthetic runs, the 40-sample run (no current B_simple) in a task of its own."""
    runs = default_runs()
    for r in runs:
        if r.uid == SHORT:
            r.task = "short-only"
    url = f"sqlite:///{tmp_path_factory.mktemp('dash_lonely') / 'noisescope.db'}"
    insert_runs(url, runs)
    with ServerProcess(url) as proc:
        yield proc.url


def test_compare_tasks_draws_no_curve_for_a_task_without_a_measured_run(
    make_app: MakeApp, lonely_server: str
) -> None:
    with Api(lonely_server) as api:
        unmeasured = [t for t in api.tasks() if t.n_measured == 0 and t.n_samples > 0]
    assert [t.task for t in unmeasured] == ["short-only"]  # so the test can tell
    keys = [_text.task_key(t.project, t.task) for t in unmeasured] + ["vision/digits"]
    at = make_app(lonely_server, "compare_tasks", tasks=keys)
    titles = list(charts(at))
    assert "B_simple against loss: vision/digits" in titles
    for t in unmeasured:
        key = _text.task_key(t.project, t.task)
        assert f"B_simple against loss: {key}" not in titles
        assert f"{key} (0 of {t.n_runs} runs measured)" in plain(texts(at))


def test_compare_tasks_summary_shows_every_batch_size(make_app: MakeApp, server: str) -> None:
    """The batch sizes column is as wide as its longest list ("…, 128" hid the 256)."""
    from noisescope_dashboard._ui import text_px

    at = make_app(server, "compare_tasks")
    summary = at.dataframe[-1]
    config = json.loads(summary.proto.columns)["batch sizes"]
    longest = max(summary.value["batch sizes"], key=len)
    assert config["width"] >= text_px(longest)


# --- item 9: Compare runs opens on one task's runs -------------------------------------------


def test_compare_runs_opens_on_runs_of_one_task(make_app: MakeApp, server: str, api: Api) -> None:
    tasks = {r.uid: (r.project, r.task) for r in api.runs(current=False)}
    at = make_app(server, "compare_runs")
    chosen = at.multiselect(key="_qp_runs").value
    assert len(chosen) >= 2 and len({tasks[u] for u in chosen}) == 1
    assert not any("whose losses are not on one scale" in c.value for c in at.caption)
    mixed = make_app(server, "compare_runs", runs=[DIGITS64, LM])  # asked for: said
    assert any("belong to 2 tasks" in c.value for c in mixed.caption)


# --- item 10: What-if says why it opens where it does, and one reading of compute -----------


def test_what_if_says_which_lower_targets_it_passed_over_and_why() -> None:
    from noisescope_dashboard._frames import Estimate, default_reason, default_source

    def fit(b_crit: float, warned: bool) -> Estimate:
        return Estimate("", b_crit, 100.0, "", warnings=("grid edge",) if warned else ())

    options = {"bcrit:1": fit(8, False), "bcrit:0.3": fit(15, False), "bcrit:0.15": fit(26.8, True)}
    chosen = default_source(options)
    assert chosen == "bcrit:0.3"
    said = default_reason(options, chosen)
    assert said is not None and said.startswith("Opened at loss 0.3: the lowest loss target")
    assert "at loss 0.15 B_crit is 26.8, with warnings" in said
    options["bcrit:0.15"] = fit(26.8, False)
    assert default_reason(options, str(default_source(options))) is None  # nothing passed over


def test_what_if_reads_compute_beyond_the_minimum_as_a_share_of_what_is_spent(
    make_app: MakeApp, server: str
) -> None:
    at = make_app(server, "what_if")
    table = at.dataframe[0].value
    assert "extra compute" not in table.columns
    for ratio, beyond in zip(table["E / E_min"], table["compute beyond E_min"], strict=True):
        e_ratio = float(ratio.rstrip("×"))  # two digits: 1.1× stands for 1.05 to 1.15
        share = float(beyond.removesuffix("% of it")) / 100
        assert abs(share - (1 - 1 / e_ratio)) < 0.05, (ratio, beyond)  # 1.5× is 33% of it


# --- item 11: a diverged run's page leads with the divergence; few points are not splines ----


def test_a_diverged_runs_page_headlines_the_divergence(make_app: MakeApp) -> None:
    import dataclasses
    import uuid

    import httpx

    from harness.synthetic_sweep import make_sweep, post
    from tests.server.test_diverged import _BlowUp

    (run,) = make_sweep(200.0, (64,), lrs=((0.3, 1.0),))
    blown = _BlowUp(**dataclasses.asdict(dataclasses.replace(run, uid=uuid.uuid4().hex)))
    with ServerProcess() as server, httpx.Client(base_url=server.url, timeout=60) as client:
        post(client, [blown], project="diverging", task="t")
        with Api(server.url) as api:
            summary = api.run(blown.uid)
        assert summary.diverged and summary.diverged_reason
        at = make_app(server.url, "run", run=blown.uid)
    loss = next(m for m in at.metric if m.label == "Loss")
    assert loss.value == "diverged"
    assert _text.sentence(summary.diverged_reason) in plain(texts(at))


def test_a_curve_of_few_points_is_drawn_straight_with_its_points() -> None:
    from noisescope_dashboard._charts._axes import SMOOTH_FROM, line_mark

    assert line_mark(8) == {"interpolate": "linear", "point": True}
    assert line_mark(SMOOTH_FROM, strokeWidth=2) == {"interpolate": "monotone", "strokeWidth": 2}
