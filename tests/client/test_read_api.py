"""``noisescope.Api`` against a real server: the server's answers come back as the very same
dataclasses, with the same numbers; errors are exceptions that say what is wrong."""

from __future__ import annotations

import dataclasses
import random
import uuid
from collections.abc import Iterator

import httpx
import pytest

import noisescope
from harness import ServerProcess, columns, run_body
from harness.synthetic_sweep import make_sweep, post
from noisescope.sweep import CriticalBatchReport


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess() as proc:
        yield proc


@pytest.fixture(scope="module")
def loaded(server: ServerProcess) -> dict[str, str]:
    """A run with 800 samples, an eval and a batch-size event, plus a 3-size sweep."""
    uid = uuid.uuid4().hex
    with httpx.Client(base_url=server.url) as c:
        assert c.put(f"/api/v1/runs/{uid}", json=run_body(project="api", task="t")).is_success
        assert c.post(f"/api/v1/runs/{uid}/samples", json={"columns": columns(800)}).is_success
        events = [
            {"step": 10, "kind": "eval", "payload": {"loss": 1.5}},
            {"step": 400, "kind": "batch_size", "payload": {"batch_size": 64}},
        ]
        assert c.post(f"/api/v1/runs/{uid}/events", json={"events": events}).is_success
        post(c, make_sweep(200.0, (32, 128, 512), rng=random.Random(0)), project="api", task="s")
    return {"run": uid}


def test_every_read_decodes_into_the_shared_dataclasses(
    server: ServerProcess, loaded: dict[str, str]
) -> None:
    api = noisescope.Api(server.url)
    raw = httpx.get(f"{server.url}/api/v1/runs/{loaded['run']}").json()
    run = api.run(loaded["run"])
    assert isinstance(run, noisescope.RunSummary)
    assert {f.name for f in dataclasses.fields(run)} == set(raw)
    assert run.b_simple == raw["b_simple"] and run.b_simple_lo == raw["b_simple_lo"]
    assert run.started_at is not None and run.started_at.tzinfo is not None
    assert run.last_eval_loss == 1.5
    assert (run.batch_in_use, run.batch_in_use_source) == (64.0, "event")
    assert [r.uid for r in api.runs(project="api", task="t")] == [loaded["run"]]
    (light,) = api.runs(project="api", task="t", current=False)  # a picker's cheap list
    assert light.b_simple is None and "not computed" in (light.b_simple_reason or "")
    assert (light.n_samples, light.batch_in_use, light.last_step) == (800, 64.0, run.last_step)
    series = api.series(loaded["run"], max_points=50, window=100)
    assert isinstance(series, noisescope.RunSeries) and 0 < len(series.points) <= 50
    assert isinstance(series.points[0], noisescope.SeriesPoint)
    assert sum(p.n for p in api.series(loaded["run"], max_points=50).points) == 800
    assert [e.kind for e in api.events(loaded["run"])] == ["eval", "batch_size"]
    assert api.series_names(loaded["run"]) == [noisescope.SeriesInfo("", 800)]
    (compared,) = api.compare([loaded["run"]])
    assert compared.run_uid == loaded["run"]
    tasks = {t.task: t for t in api.tasks(project="api")}
    assert tasks["t"].n_runs == 1 and isinstance(tasks["t"], noisescope.TaskSummary)
    # a sweep fit needs runs at MIN_BATCH_SIZES (3) batch sizes: "s" has them, "t" one
    assert (tasks["s"].swept, tasks["t"].swept) == (True, False)
    report = api.critical_batch("api", "s")
    assert isinstance(report, CriticalBatchReport)
    assert report.batch_sizes == [32.0, 128.0, 512.0]
    assert report.targets and report.targets[0].points[0].run_uids
    rec = api.recommendation(loaded["run"])
    assert rec.recommendation.b_simple == run.b_simple  # one current B_simple
    assert rec.recommendation.batch_size == 64.0 and rec.batch_size_source == "event"
    plan = api.parallelism(2000, 32, batch_size=256)
    assert plan.rows[0].devices == 1 and plan.verdict is not None
    assert plan.reference == "B_crit" and "× B_crit" in plan.verdict
    plan = api.parallelism(2000, 32, batch_size=256, reference="B_simple")
    assert plan.reference == "B_simple" and plan.verdict is not None
    assert "× B_simple" in plan.verdict and "B_crit ≈ B_simple = 2,000" in plan.summary
    assert api.samples_csv(loaded["run"]).count("\n") == 801
    assert "api" in api.projects()


def test_frames_have_one_row_per_item(server: ServerProcess, loaded: dict[str, str]) -> None:
    pytest.importorskip("pandas")
    api = noisescope.Api(server.url)
    frame = noisescope.to_frame(api.runs(project="api"))
    assert len(frame) == 1 + 3 * 3 and "b_simple" in frame.columns  # the run and the sweep
    points = api.series(loaded["run"], max_points=20).to_frame()
    assert len(points) <= 20 and points["n"].sum() == 800
    report = api.critical_batch("api", "s")
    targets = noisescope.to_frame(report.targets)
    assert targets["b_crit"].tolist() == [t.b_crit for t in report.targets]
    frontier = noisescope.to_frame(report.targets[0].points)
    assert frontier["batch_size"].tolist() == [32.0, 128.0, 512.0]
    assert sorted(noisescope.to_frame(api.tasks(project="api"))["task"]) == ["s", "t"]


def test_errors_name_what_is_wrong(server: ServerProcess) -> None:
    api = noisescope.Api(server.url)
    with pytest.raises(noisescope.NotFoundError, match="does not exist"):
        api.run("no-such-run")
    with pytest.raises(noisescope.NotFoundError):
        api.critical_batch("api", "no-such-task")
    with pytest.raises(noisescope.ApiError, match="422"):
        api.parallelism(100, 1, min_speedup=3)
    with pytest.raises(noisescope.ApiError, match="'B_crit' or 'B_simple'"):
        api.parallelism(100, 1, reference="B_noise")
    with pytest.raises(TypeError, match="step_time_s"):  # a misspelt option is no query
        api.parallelism(100, 1, step_time_s=0.5)  # type: ignore[call-arg]
    with pytest.raises(noisescope.ApiError, match="no answer"):
        noisescope.Api("http://127.0.0.1:9", timeout=2).runs()


def test_url_and_token_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOISESCOPE_URL", "http://127.0.0.1:1234/")
    assert noisescope.Api().url == "http://127.0.0.1:1234"


def test_names_that_are_dot_segments_are_read_over_http(server: ServerProcess) -> None:
    """Issue 46, 9 (a): requests removes the dot segments of a path, so ``..`` as a project or
    task was a 404 (``/tasks/./../critical-batch``); they travel as ``%2E`` now."""
    with httpx.Client(base_url=server.url) as c:
        for i, (p, t) in enumerate(((".", ".."), ("..", "."))):
            post(c, make_sweep(200.0, (32, 128, 512), rng=random.Random(10 + i)), project=p, task=t)
    api = noisescope.Api(server.url)
    for p, t in ((".", ".."), ("..", ".")):
        report = api.critical_batch(p, t)
        assert (report.project, report.task, report.batch_sizes) == (p, t, [32.0, 128.0, 512.0])
        forecast = api.critical_batch_forecast(p, t)
        assert (forecast.project, forecast.task) == (p, t)


def test_a_password_in_the_url_is_in_no_error(server: ServerProcess) -> None:
    """Issue 46, 10: ``ApiError`` (its message, ``url`` and ``detail``, and the transport error
    it comes from) names the server without the URL's password."""
    host = server.url.removeprefix("http://")
    with pytest.raises(noisescope.NotFoundError) as found:
        noisescope.Api(f"http://me:hunter2@{host}").run("no-such-run")
    with pytest.raises(noisescope.ApiError) as unreachable:
        noisescope.Api("http://me:hunter2@127.0.0.1:9", timeout=2).runs()
    for info in (found, unreachable):
        exc = info.value
        shown = [str(exc), exc.url, exc.detail, str(exc.__cause__ or "")]
        assert not any("hunter2" in text for text in shown), shown
        assert "me:***@" in exc.url


def test_events_bounded_and_counted(server: ServerProcess, loaded: dict[str, str]) -> None:
    api = noisescope.Api(server.url)
    assert api.event_counts(loaded["run"]) == {"batch_size": 1, "eval": 1}
    (latest,) = api.events(loaded["run"], kinds=["batch_size"], max_events=5)
    assert latest.payload == {"batch_size": 64}
    assert [e.kind for e in api.events(loaded["run"], exclude_kinds=["eval"])] == ["batch_size"]
    assert len(api.events(loaded["run"], max_events=1)) == 1
