"""Issue 46, items 9 and 10, on the pages: two tasks whose ``project/task`` read alike are
both reachable, a run with per-layer series only shows them, a run with thousands of events
draws a bounded number of them and says so, and no page shows the password of the server URL.

One server on runs written for this module (the shared synthetic runs stay as they are)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine

from harness import ServerProcess, columns
from noisescope_dashboard import _frames, _text
from noisescope_server import crud
from noisescope_server.db import make_engine, upgrade

from ._app import chart_data, plain, texts
from .conftest import MakeApp

LAYERS_ONLY = "layersonly" + "0" * 22
EVENTFUL = "eventful" + "0" * 24
#: Two tasks that a key of "project/task" written plainly confuses.
COLLIDING = (("col", "x/y", "c1" + "0" * 30), ("col/x", "y", "c2" + "0" * 30))
MARKS, EVALS = 1000, 600
B_CHART = "B_simple with its 90% interval and the batch in use"


def _run(engine: Engine, uid: str, project: str, task: str) -> None:
    body = crud.RunIn(project=project, task=task, name=uid[:10], batch_size=32.0)
    crud.upsert_run(engine, uid, body)


def _samples(engine: Engine, uid: str, cols: dict[str, list[Any]]) -> None:
    crud.ingest_samples(engine, uid, crud.validate_samples({"columns": cols}))


@pytest.fixture(scope="module")
def round3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = f"sqlite:///{tmp_path_factory.mktemp('round3') / 'noisescope.db'}"
    engine = make_engine(url)
    upgrade(engine)
    for project, task, uid in COLLIDING:
        _run(engine, uid, project, task)
        _samples(engine, uid, columns(200))
    _run(engine, LAYERS_ONLY, "layers", "t")
    for i in range(3):  # three layers at steps 0..299, no whole-model series
        cols = columns(300, start=300 * i, series=f"layer.{i}")
        cols["step"] = list(range(300))
        _samples(engine, LAYERS_ONLY, cols)
    _run(engine, EVENTFUL, "events", "t")
    _samples(engine, EVENTFUL, columns(2000))
    events = [crud.EventIn(step=2 * i, kind="checkpoint", payload={"i": i}) for i in range(MARKS)]
    events += [
        crud.EventIn(step=3 * i, kind="eval", payload={"loss": 2.0 / (1 + i)}) for i in range(EVALS)
    ]
    crud.ingest_events(engine, EVENTFUL, events)
    engine.dispose()
    with ServerProcess(url) as proc:
        yield proc.url


def test_task_keys_name_one_task_each() -> None:
    keys = {_text.task_key(p, t) for p, t, _ in COLLIDING}
    assert keys == {"col/x/y", "col%2Fx/y"}
    assert _text.task_key("vision", "digits") == "vision/digits"  # plain names as before
    assert _text.task_key("a%2Fb", "c") != _text.task_key("a/b", "c")


def test_both_colliding_tasks_are_reachable(make_app: MakeApp, round3: str) -> None:
    at = make_app(round3, "critical_batch", task="col%2Fx/y")
    box = at.selectbox(key="_qp_task")
    assert {"col/x/y", "col%2Fx/y"} <= set(box.options)
    assert box.value == "col%2Fx/y"
    at = make_app(round3, "critical_batch", task="col/x/y")
    assert at.selectbox(key="_qp_task").value == "col/x/y"
    assert not at.error


def test_a_run_with_layer_series_only_shows_them(make_app: MakeApp, round3: str) -> None:
    at = make_app(round3, "run", run=LAYERS_ONLY)
    warning = plain(at.warning[0].value)
    assert warning.startswith("No B_simple now: this run logged 3 per-layer series (900 samples)")
    assert "no samples" not in texts(at)
    assert at.multiselect(key="layers").value == ["layer.0", "layer.1", "layer.2"]
    drawn = [f for f in chart_data(at)["B_simple per layer"] if "layer" in f]
    assert drawn and all(set(f["layer"]) == {"layer.0", "layer.1", "layer.2"} for f in drawn)


def test_a_run_with_many_events_draws_a_bounded_number(make_app: MakeApp, round3: str) -> None:
    at = make_app(round3, "run", run=EVENTFUL)
    caption = next(c.value for c in at.caption if c.value.startswith("The charts draw"))
    every = -(-MARKS // _frames.MAX_MARKS)
    drawn = len(range(0, MARKS, every))
    assert plain(caption).startswith(
        f"The charts draw {drawn} of its 1,000 marks (one in {every}), spread over the run"
    )
    assert "evaluation" not in caption  # 600 evaluations: all drawn
    (rules,) = [f for f in chart_data(at)[B_CHART] if "label" in f and len(f)]
    assert len(rules) == drawn <= _frames.MAX_MARKS
    assert rules["step"].tolist() == [2 * i for i in range(0, MARKS, every)]
    evals = [f for f in chart_data(at)["Loss (evaluations as points)"] if "loss" in f]
    assert max(len(f) for f in evals) >= EVALS


def test_no_page_shows_the_password_of_the_server_url(make_app: MakeApp) -> None:
    at = make_app("http://me:hunter2@127.0.0.1:9", "runs")
    (error,) = at.error
    assert "Cannot reach the noisescope server at" in error.value
    assert "hunter2" not in error.value and "me:***@127" in plain(error.value)
