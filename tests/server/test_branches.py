"""Branch runs on the server: linked to their parent, validated, read back as the same local
critical batch size the training job computed; and the forecast endpoint."""

from __future__ import annotations

import random
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import Engine, update

import noisescope
from harness import AppServer, columns, run_body
from harness.http_clients import HttpClient, HttpResponse
from harness.lsq_branch import (
    DiesAfter,
    Killed,
    NoisyLeastSquares,
    branch_logged_parent,
    logged_plan,
)
from harness.synthetic_sweep import make_sweep, post
from noisescope import branch
from noisescope.forecast import forecast_report
from noisescope_server.models import Run


def _parent_with_branches(server: AppServer, tmp_path: Path) -> tuple[str, Any, str]:
    project = f"br-{uuid.uuid4().hex[:8]}"
    parent = noisescope.init(
        server.url,
        project=project,
        task="lsq",
        batch_size=4,
        dir=tmp_path / "spool",
        quiet=True,
        transport=server.transport(),
    )
    result = branch_logged_parent(parent, server.url, tmp_path, transport=server.transport())
    parent.finish()
    return parent.id, result, project


def test_branch_runs_are_linked_and_read_back_with_the_same_numbers(
    server: AppServer, tmp_path: Path
) -> None:
    parent_id, result, project = _parent_with_branches(server, tmp_path)
    api = server.api()
    answer = api.branches(parent_id)
    assert isinstance(answer, noisescope.RunBranches) and answer.run_uid == parent_id
    (point,) = answer.points
    local = result.local
    assert point.step == 50 and point.n_runs == 8 and point.seeds == 2
    assert point.batch_sizes == [4.0, 16.0, 64.0, 256.0]
    assert point.parent_loss == pytest.approx(result.parent_loss)
    assert point.b_crit == pytest.approx(local.b_crit)
    assert point.b_crit_lo == pytest.approx(local.b_crit_lo)
    assert (point.b_crit_hi is None) == (local.b_crit_hi is None)
    assert point.epsilon == 0.02
    kids = [r for r in api.runs(project=project) if r.parent_uid == parent_id]
    assert len(kids) == 8 and {k.branch_step for k in kids} == {50}
    assert sorted(k.uid for k in kids) == point.run_ids
    assert api.run(parent_id).parent_uid is None
    # a rerun of the same sweep reuses every branch and logs nothing new
    resumed = NoisyLeastSquares()
    resumed.sgd(8, 0.2, 50, np.random.default_rng(1))  # the parent's checkpoint, reloaded
    again = branch.run(result.plan, resumed, tmp_path / "store")
    assert again.reused == 8 and api.branches(parent_id).points == answer.points


def test_a_killed_and_resumed_logged_sweep_leaves_no_orphan_branch_runs(
    server: AppServer, tmp_path: Path
) -> None:
    project = f"kill-{uuid.uuid4().hex[:8]}"
    parent = noisescope.init(
        server.url, project=project, task="lsq", quiet=True, transport=server.transport()
    )
    plan, log = logged_plan(
        parent,
        server.url,
        {"quiet": True, "transport": server.transport()},
        step=0,
        batch_size=4,
        lr=0.3,
        multipliers=(1, 4, 16),
        budget=1024,
        lr_rule="constant",
    )
    with pytest.raises(Killed):  # killed while training its 4th branch, whose run is open
        branch.run(plan, DiesAfter(3), tmp_path, log=log)
    branch.run(plan, NoisyLeastSquares(), tmp_path, log=log)
    parent.finish()
    (point,) = server.api().branches(parent.id).points
    assert point.n_runs == 6 and point.b_crit_lo is not None, point.reason


def test_a_run_without_branches_and_an_unknown_run(server: AppServer, run_id: str) -> None:
    with server.client() as c:
        assert c.put(f"/api/v1/runs/{run_id}", json=run_body()).is_success
        empty = c.get(f"/api/v1/runs/{run_id}/branches").json()
        assert empty["points"] == [] and empty["plateau_step"] is None
        missing = c.get(f"/api/v1/runs/{uuid.uuid4().hex}/branches")
        assert missing.status_code == 404 and "does not exist" in missing.json()["detail"]


def test_a_branch_without_an_outcome_says_so(server: AppServer, run_id: str) -> None:
    parent = run_id
    with server.client() as c:
        assert c.put(f"/api/v1/runs/{parent}", json=run_body()).is_success
        for size in (8, 16):
            kid = uuid.uuid4().hex
            body = run_body(batch_size=size, parent_run_id=parent, branch_step=7)
            assert c.put(f"/api/v1/runs/{kid}", json=body).is_success
        (point,) = c.get(f"/api/v1/runs/{parent}/branches").json()["points"]
    assert point["b_crit"] is None and "2 of 2 branch runs have no outcome" in point["reason"]


def test_branches_in_other_units_are_left_out(server: AppServer, run_id: str) -> None:
    with server.client() as c:
        assert c.put(f"/api/v1/runs/{run_id}", json=run_body()).is_success
        for size, units in ((8, "examples"), (512, "tokens")):
            body = run_body(batch_size=size, units=units, parent_run_id=run_id, branch_step=3)
            assert c.put(f"/api/v1/runs/{uuid.uuid4().hex}", json=body).is_success
        (point,) = c.get(f"/api/v1/runs/{run_id}/branches").json()["points"]
    assert point["n_runs"] == 1 and "1 branch runs count other units" in point["reason"]


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"parent_run_id": "../etc", "branch_step": 1}, "parent_run_id"),
        ({"parent_run_id": 5, "branch_step": 1}, "parent_run_id"),
        ({"parent_run_id": "abc", "branch_step": "3"}, "branch_step"),
        ({"parent_run_id": "abc", "branch_step": -1}, "branch_step"),
        ({"parent_run_id": "abc", "branch_step": 1.5}, "branch_step"),
        ({"parent_run_id": "abc"}, "go together"),
        ({"branch_step": 3}, "go together"),
    ],
)
def test_bad_branch_fields_are_refused_and_nothing_is_stored(
    server: AppServer, run_id: str, extra: dict[str, Any], field: str
) -> None:
    with server.client() as c:
        r = c.put(f"/api/v1/runs/{run_id}", json=run_body(**extra))
        assert r.status_code == 422, r.text
        assert field in r.json()["detail"]
        assert c.get(f"/api/v1/runs/{run_id}").status_code == 404


@pytest.mark.parametrize(
    "plan",
    [
        {"epsilon": -1},
        {"epsilon": 0},
        {"epsilon": True},
        {"epsilon": "0.01"},
        {"seed": 1.5},
        {"seed": "1"},
        {"multiplier": 0},
        {"budget": 0},
        {"budget": 2.5},
        {"step": -1},
        {"lr": 0},
        {"lr": -0.1},
        {"parent_run_id": "../x"},
    ],
)
def test_a_branch_plan_the_reader_cannot_use_is_refused_and_nothing_changes(
    server: AppServer, run_id: str, plan: dict[str, Any]
) -> None:
    """Issue 29: ε = -1 was accepted (201) and made GET /runs/{parent}/branches a 500."""
    parent = uuid.uuid4().hex
    good = run_body(batch_size=8, parent_run_id=parent, branch_step=1)
    good["config"] = {"branch": {"epsilon": 0.01, "seed": 0, "multiplier": 1, "budget": 64}}
    bad = {**good, "config": {"branch": {**good["config"]["branch"], **plan}}}
    (name,) = plan
    with server.client() as c:
        assert c.put(f"/api/v1/runs/{parent}", json=run_body()).is_success
        assert c.put(f"/api/v1/runs/{run_id}", json=good).status_code == 201
        for uid in (run_id, uuid.uuid4().hex):
            r = c.put(f"/api/v1/runs/{uid}", json=bad)
            assert r.status_code == 422, r.text
            assert f"config.branch.{name} must be" in r.json()["detail"]
            assert c.get(f"/api/v1/runs/{uid}").status_code == (200 if uid == run_id else 404)
        assert c.get(f"/api/v1/runs/{run_id}").json()["config"] == good["config"]
        assert c.get(f"/api/v1/runs/{parent}/branches").status_code == 200


def test_a_config_branch_that_is_no_object_is_an_ordinary_value(
    server: AppServer, run_id: str
) -> None:
    with server.client() as c:
        body = run_body() | {"config": {"branch": "main", "lr": 0.1}}
        assert c.put(f"/api/v1/runs/{run_id}", json=body).status_code == 201


def test_a_run_cannot_branch_from_itself(server: AppServer, run_id: str) -> None:
    with server.client() as c:
        r = c.put(f"/api/v1/runs/{run_id}", json=run_body(parent_run_id=run_id, branch_step=0))
        assert r.status_code == 422 and "branch of itself" in r.json()["detail"]


def _put(c: HttpClient, uid: str, **extra: Any) -> HttpResponse:
    return c.put(f"/api/v1/runs/{uid}", json=run_body(**extra))


def test_parent_links_that_could_never_be_shown_are_refused(server: AppServer) -> None:
    """Issue 29 item 8: a parent in another project, a branch of a branch and a cycle were
    accepted (201) and then invisible: a run's branches are read in its own project, one
    level deep. Each refusal names parent_run_id and stores nothing."""
    parent, kid, other, late = (uuid.uuid4().hex for _ in range(4))
    with server.client() as c:
        assert _put(c, parent).status_code == 201
        assert _put(c, other, project="elsewhere").status_code == 201
        assert _put(c, kid, parent_run_id=parent, branch_step=5).status_code == 201
        refusals = [
            (late, {"parent_run_id": other}, "another project"),
            (late, {"parent_run_id": kid}, "itself a branch"),
            (
                parent,
                {"parent_run_id": kid},
                "itself a branch",
            ),  # the cycle parent -> kid -> parent
            (parent, {"parent_run_id": other, "project": "elsewhere"}, "another project"),
            (parent, {"parent_run_id": late}, "has branch runs of its own"),
        ]
        for uid, link, why in refusals:
            r = _put(c, uid, **{"branch_step": 1, **link})
            assert r.status_code in (409, 422), r.text
            if r.status_code == 422:
                assert "parent_run_id" in r.json()["detail"] and why in r.json()["detail"], r.text
        assert c.get(f"/api/v1/runs/{late}").status_code == 404
        assert c.get(f"/api/v1/runs/{parent}").json()["parent_uid"] is None
        (point,) = c.get(f"/api/v1/runs/{parent}/branches").json()["points"]
        assert point["run_ids"] == [kid]


def test_a_parent_not_on_the_server_yet_is_accepted(server: AppServer) -> None:
    """A branch run may arrive before its parent (the client creates runs in the background,
    and sync delivers spooled runs in any order): its points show once the parent is there."""
    parent, kid = uuid.uuid4().hex, uuid.uuid4().hex
    with server.client() as c:
        assert _put(c, kid, parent_run_id=parent, branch_step=2**63 - 1).status_code == 201
        assert _put(c, parent).status_code == 201
        (point,) = c.get(f"/api/v1/runs/{parent}/branches").json()["points"]
    assert point["run_ids"] == [kid] and point["step"] == 2**63 - 1


def test_a_re_put_without_the_fields_keeps_the_link(server: AppServer, run_id: str) -> None:
    with server.client() as c:
        body = run_body(parent_run_id="p1", branch_step=4)
        assert c.put(f"/api/v1/runs/{run_id}", json=body).is_success
        assert c.put(f"/api/v1/runs/{run_id}", json=run_body()).is_success
        got = c.get(f"/api/v1/runs/{run_id}").json()
    assert got["parent_uid"] == "p1" and got["branch_step"] == 4


def test_the_forecast_endpoint_is_the_client_forecast_of_the_sweep(server: AppServer) -> None:
    project = f"fc-{uuid.uuid4().hex[:8]}"
    with server.client() as c:
        sweep_runs = make_sweep(200.0, (32, 64, 128, 256, 512), rng=random.Random(1))
        post(c, sweep_runs, project=project, task="s")
    api = server.api()
    targets = [2.0, 1.5, 1.0, 0.8]
    answer = api.critical_batch_forecast(project, "s", losses=[1.2, 0.6], targets=targets)
    before = api.critical_batch(project, "s", targets=targets)
    expected_runs = before.n_runs
    expected = forecast_report(before, [1.2, 0.6])
    assert answer == expected
    assert [p.extrapolation for p in answer.predictions] == [False, True]
    # branch runs of the task are no sweep points: the analysis and the law stay the same
    some_run = api.runs(project=project)[0].uid
    with server.client() as c:
        for size in (32, 512):
            body = run_body(project=project, task="s", batch_size=size)
            body |= {"parent_run_id": some_run, "branch_step": 5}
            assert c.put(f"/api/v1/runs/{uuid.uuid4().hex}", json=body).is_success
    report = api.critical_batch(project, "s", targets=targets)
    assert report.n_runs == expected_runs and any("2 branch runs" in w for w in report.warnings)
    again = api.critical_batch_forecast(project, "s", losses=[1.2, 0.6], targets=targets)
    assert again.predictions == answer.predictions
    with server.client() as c:
        path = f"/api/v1/tasks/{project}/s/critical-batch/forecast"
        bad = c.get(path, params={"loss": "-1"})
        assert bad.status_code == 422
        assert "loss must be a finite positive number" in bad.json()["detail"]
        assert c.get(path, params={"loss": "nan"}).status_code == 422
        for route in (path, path.removesuffix("/forecast")):  # one rule for the sweep's targets
            bad = c.get(route, params={"targets": "inf"})
            assert (
                bad.status_code == 422 and bad.json()["detail"] == "targets must be finite numbers"
            )
        assert c.get(f"/api/v1/tasks/{project}/nope/critical-batch/forecast").status_code == 404


def test_each_branch_point_gives_the_examples_its_parent_had_seen(
    server: AppServer, run_id: str
) -> None:
    """Steps 0..99 at 32 examples a step, blocks of 64 samples: step 50 falls inside the first
    block, 70 inside the second, 500 after the last sample; a parent logging no examples
    gives none."""
    bare = uuid.uuid4().hex
    with server.client() as c:
        for parent, cols in ((run_id, columns(100)), (bare, columns(100))):
            assert c.put(f"/api/v1/runs/{parent}", json=run_body()).is_success
            if parent == bare:
                cols.pop("examples")
            posted = c.post(f"/api/v1/runs/{parent}/samples", json={"columns": cols})
            assert posted.is_success, posted.text
            for step in (50, 70, 500):
                body = run_body(batch_size=8, parent_run_id=parent, branch_step=step)
                assert c.put(f"/api/v1/runs/{uuid.uuid4().hex}", json=body).is_success
        points = server.api().branches(run_id).points
        bare_points = server.api().branches(bare).points
    assert [p.parent_examples for p in points] == [50 * 32.0, 70 * 32.0, 99 * 32.0]
    assert [p.parent_examples for p in bare_points] == [None, None, None]


def _branch_kid(
    c: HttpClient, parent: str, size: int, seed: int, loss: float, epsilon: object
) -> str:
    kid = uuid.uuid4().hex
    body = run_body(batch_size=size, parent_run_id=parent, branch_step=9)
    body["config"] = {"branch": {"epsilon": epsilon, "seed": seed}}
    assert c.put(f"/api/v1/runs/{kid}", json=body).is_success
    event = {"seq": 0, "step": 4, "kind": "branch", "payload": {"loss": loss}}
    assert c.post(f"/api/v1/runs/{kid}/events", json={"events": [event]}).is_success
    return kid


def test_a_crossing_the_grid_does_not_resolve_is_served_as_a_bracket(
    server: AppServer, run_id: str
) -> None:
    """The first doubling already overshoots by ~30 ε: between 16 and 32, not "16.3"."""
    with server.client() as c:
        assert c.put(f"/api/v1/runs/{run_id}", json=run_body()).is_success
        for size, factor in ((16, 1.0), (32, 1.3), (64, 1.6)):
            for seed, base in enumerate((1.0, 1.2)):
                _branch_kid(c, run_id, size, seed, base * factor + 1e-4 * seed, 0.01)
    (point,) = server.api().branches(run_id).points
    assert point.b_crit is None and (point.b_crit_lo, point.b_crit_hi) == (16.0, 32.0)
    assert point.b_crit_interpolated is not None and 16 < point.b_crit_interpolated < 17
    assert point.reason is not None and "between 16 and 32" in point.reason


def test_stored_branch_runs_with_a_bad_epsilon_are_left_out_with_a_note(
    server: AppServer, engine: Engine, run_id: str
) -> None:
    """Issue 29: rows accepted with ε = -1 (or 0) made GET /runs/{parent}/branches a 500; the
    write path refuses them now, so rows stored before are written around it here."""
    with server.client() as c:
        assert c.put(f"/api/v1/runs/{run_id}", json=run_body()).is_success
        kids = {
            _branch_kid(c, run_id, size, 0, loss, 0.01): epsilon
            for size, loss, epsilon in ((8, 1.0, -1), (16, 1.5, -1), (32, 1.0, 0))
        }
        with engine.begin() as conn:
            for kid, epsilon in kids.items():
                config = {"branch": {"epsilon": epsilon, "seed": 0}}
                conn.execute(update(Run).where(Run.uid == kid).values(config=config))
        answer = c.get(f"/api/v1/runs/{run_id}/branches")
    assert answer.status_code == 200, answer.text
    (point,) = answer.json()["points"]
    assert point["b_crit"] is None and point["n_runs"] == 3
    assert "3 of 3 branch runs have an ε that is no positive number" in point["reason"]
