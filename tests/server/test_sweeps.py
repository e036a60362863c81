"""``GET /tasks/{project}/{task}/critical-batch`` on sweeps with a known B_crit, through the real
server on SQLite and PostgreSQL: which loss, which runs, the answer and its warnings."""

from __future__ import annotations

import dataclasses
import random
import uuid
from typing import Any

import pytest
from starlette.testclient import TestClient

from harness import AppServer
from harness.synthetic_sweep import L0, SynthRun, make_sweep, post
from noisescope.estimators import training_loss_curve
from noisescope_server import sweeps
from noisescope_server.queries._buckets import BucketSums

API = "/api/v1"
BATCHES = (16, 32, 64, 128, 256, 512)
B_CRIT = 200.0


def critical(client: TestClient, project: str, task: str, **params: Any) -> dict[str, Any]:
    r = client.get(f"{API}/tasks/{project}/{task}/critical-batch", params=params)
    assert r.status_code == 200, r.text
    report: dict[str, Any] = r.json()
    return report


@pytest.fixture(scope="module")
def sweep_project(server: AppServer) -> str:
    """One project holding the module's sweeps (posted once per backend)."""
    project = f"sweep-{uuid.uuid4().hex[:8]}"
    with server.client() as client:
        for task, evals in (("evals", True), ("train", False)):
            runs = make_sweep(B_CRIT, BATCHES, seeds=2, seed_spread=0.03, rng=random.Random(5))
            post(client, runs, project=project, task=task, evals=evals, train_noise=0.05)
    return project


def test_b_crit_from_evaluation_losses_is_within_ten_percent(
    client: TestClient, sweep_project: str
) -> None:
    report = critical(client, sweep_project, "evals")
    assert report["loss_source"] == "eval"
    assert report["default_targets"] is True
    assert report["batch_sizes"] == list(BATCHES)
    assert report["excluded"] == []
    assert len(report["targets"]) >= 3
    for t in report["targets"]:
        assert t["determined"], t["warnings"]
        assert t["b_crit"] == pytest.approx(B_CRIT, rel=0.10)
        assert t["b_crit_lo"] <= t["b_crit"] <= t["b_crit_hi"]
        assert {p["lr"] for p in t["points"]} == {0.3}  # the fastest learning rate
        assert t["b_simple"] == pytest.approx(B_CRIT / 2, rel=0.01)  # wobble: odd windows
        frontier = {u for p in t["points"] for u in p["run_uids"]}
        assert {r["uid"] for r in t["runs"] if r["frontier"]} == frontier
        assert t["b_crit_estimate"] == t["b_crit"]
        # a clean sweep (best lr inside the grid, 2 seeds, nothing diverged) raises no check
        assert not [w for w in t["warnings"] if "learning rate" in w or "seed" in w]
    assert not [w for w in report["warnings"] if "diverged" in w]


def test_b_crit_from_a_noisy_training_loss_is_within_ten_percent(
    client: TestClient, sweep_project: str
) -> None:
    report = critical(client, sweep_project, "train")
    assert report["loss_source"] == "train"
    assert "training loss averaged" in report["loss_method"]
    for t in report["targets"]:
        assert t["determined"], t["warnings"]
        assert t["b_crit"] == pytest.approx(B_CRIT, rel=0.10)


def test_targets_can_be_given_and_the_loss_source_forced(
    client: TestClient, sweep_project: str
) -> None:
    report = critical(client, sweep_project, "evals", targets=[1.2, 0.9], loss="train")
    assert report["default_targets"] is False
    assert [t["target"] for t in report["targets"]] == [1.2, 0.9]
    assert report["loss_source"] == "train"
    # forcing evaluations on a task without any: every run is left out, with the reason
    report = critical(client, sweep_project, "train", loss="eval")
    assert len(report["excluded"]) == len(BATCHES) * 3 * 2
    assert {e["reason"] for e in report["excluded"]} == {"fewer than 2 evaluation losses"}
    assert {e["kind"] for e in report["excluded"]} == {"too_few_evaluations"}
    assert any("3 or more" in w for w in report["warnings"])


def test_runs_that_cannot_be_on_the_curve_are_left_out_with_their_reason(
    client: TestClient,
) -> None:
    project = f"mixed-{uuid.uuid4().hex[:8]}"
    runs = make_sweep(B_CRIT, (32, 128, 512), lrs=((0.3, 1.0),))
    post(client, runs, project=project, task="t")
    changed = runs[0].uid
    event = {"events": [{"step": 5, "kind": "batch_size", "payload": {"batch_size": 64}}]}
    assert client.post(f"{API}/runs/{changed}/events", json=event).status_code == 200
    tokens = uuid.uuid4().hex
    body = {"project": project, "task": "t", "batch_size": 4096, "units": "tokens"}
    assert client.put(f"{API}/runs/{tokens}", json=body).status_code == 201
    report = critical(client, project, "t")
    reasons = {e["uid"]: e["reason"] for e in report["excluded"]}
    assert "batch size changed" in reasons[changed]
    assert "tokens" in reasons[tokens]
    kinds = {e["uid"]: e["kind"] for e in report["excluded"]}
    assert kinds == {changed: "batch_size_changed", tokens: "units"}
    assert report["batch_sizes"] == [128.0, 512.0]
    for t in report["targets"]:  # two batch sizes left: warnings, no confident number
        assert not t["determined"]
        assert any("a fit needs at least 3" in w for w in t["warnings"])
        assert (t["b_crit"], t["b_crit_lo"], t["b_crit_hi"]) == (None, None, None)


def test_an_undetermined_b_crit_is_null_with_the_estimate_named_as_such(
    server: AppServer, client: TestClient
) -> None:
    project = f"above-{uuid.uuid4().hex[:8]}"
    post(
        client, make_sweep(B_CRIT, (2048, 4096, 8192), lrs=((0.3, 1.0),)), project=project, task="t"
    )
    report = critical(client, project, "t")
    assert report["targets"]
    for t in report["targets"]:
        assert not t["determined"] and t["warnings"]
        assert (t["b_crit"], t["b_crit_lo"], t["b_crit_hi"]) == (None, None, None)
        assert t["b_crit_estimate"] > 0
    api = server.api()
    decoded = api.critical_batch(project, "t")
    assert decoded.targets[0].b_crit is None
    assert decoded.targets[0].b_crit_estimate == report["targets"][0]["b_crit_estimate"]
    with pytest.raises(ValueError, match="not determined"):  # no plan on a number that is none
        api.parallelism(decoded.targets[0].b_crit, per_device_batch=32)


@dataclasses.dataclass(frozen=True)
class _BlowUp(SynthRun):
    """A run whose loss falls like the model's until 40% of its steps, then climbs above where
    it started."""

    def loss(self, step: float) -> float:
        turn = 0.4 * self.steps
        if step <= turn:
            return super().loss(step)
        return super().loss(turn) + (step - turn) / (self.steps - turn) * L0


def test_diverged_runs_edges_of_the_grid_and_single_seeds_are_said_by_the_api(
    client: TestClient,
) -> None:
    project = f"checks-{uuid.uuid4().hex[:8]}"
    rising = ((0.1, 0.55), (0.3, 0.8), (1.0, 1.0))  # the largest lr is the fastest
    runs = make_sweep(B_CRIT, (32, 128, 512), lrs=rising)
    blow_up = _BlowUp(**dataclasses.asdict(make_sweep(B_CRIT, (512,), lrs=((3.0, 1.0),))[0]))
    post(client, [*runs, blow_up], project=project, task="t")
    report = critical(client, project, "t")
    (out,) = report["excluded"]
    assert out["uid"] == blow_up.uid
    assert out["reason"].startswith("diverged: its loss rose from")
    assert out["kind"] == "diverged"
    (said,) = [w for w in report["warnings"] if "diverged" in w]
    assert f"1 of {len(runs) + 1} runs diverged" in said and "B512-lr3" in said
    assert report["targets"]
    for t in report["targets"]:
        said = " | ".join(t["warnings"])
        # lr 1 is the largest tried at 32 and 128; at 512 the diverged lr 3 was tried above it
        assert "at batch sizes 32, 128 the fastest learning rate is the largest tried" in said
        assert "every frontier point comes from a single seed" in said
        assert all(r["uid"] != blow_up.uid for r in t["runs"])
    kept = critical(client, project, "t", include_diverged="true")
    assert kept["excluded"] == []
    assert any("kept in the analysis" in w for w in kept["warnings"])


def test_some_runs_with_evaluations_fall_back_to_training_loss_for_all(
    client: TestClient,
) -> None:
    project = f"some-evals-{uuid.uuid4().hex[:8]}"
    runs = make_sweep(B_CRIT, (32, 128, 512), lrs=((0.3, 1.0),))
    post(client, runs[:1], project=project, task="t")
    post(client, runs[1:], project=project, task="t", evals=False)
    report = critical(client, project, "t")
    assert report["loss_source"] == "train"
    assert any("1 of 3 runs logged evaluation losses" in w for w in report["warnings"])


def test_unknown_tasks_and_bad_targets_are_4xx(client: TestClient, sweep_project: str) -> None:
    r = client.get(f"{API}/tasks/{sweep_project}/no-such-task/critical-batch")
    assert r.status_code == 404
    assert "does not exist" in r.json()["detail"]
    r = client.get(f"{API}/tasks/{sweep_project}/evals/critical-batch", params={"targets": "nan"})
    assert r.status_code == 422
    r = client.get(f"{API}/tasks/{sweep_project}/evals/critical-batch", params={"loss": "x"})
    assert r.status_code == 422
    url = f"{API}/tasks/{sweep_project}/evals/critical-batch"
    for bad in ("abc", "inf", "-inf", "1e999", "", "0x10"):
        r = client.get(url, params={"targets": bad})
        assert r.status_code == 422 and r.json()["detail"], bad
    r = client.get(url, params={"targets": [str(i) for i in range(51)]})
    assert r.status_code == 422 and "at most 50" in r.json()["detail"]
    for path in ("p%00/t", "%ff%fe/t", "..%2F../t", "x" * 5000 + "/t"):
        r = client.get(f"{API}/tasks/{path}/critical-batch")
        assert r.status_code in (404, 422), path
        assert len(r.text) < 400, "the refusal names the task without echoing it whole"


def test_names_with_slashes_and_odd_characters_are_reachable(
    server: AppServer, client: TestClient
) -> None:
    for project, task in (
        (f"slash/{uuid.uuid4().hex[:8]}", "a/b"),
        (f"odd {uuid.uuid4().hex[:8]} %2F?#", "ü & <b>x</b>"),
    ):
        runs = make_sweep(B_CRIT, (32, 128, 512), lrs=((0.3, 1.0),))
        post(client, runs, project=project, task=task)
        report = server.api().critical_batch(project, task)
        assert (report.project, report.task) == (project, task)
        assert report.n_runs == 3 and report.targets


def test_parallelism_answers_the_device_question(client: TestClient) -> None:
    r = client.get(
        f"{API}/parallelism",
        params={"b_crit": 2000, "per_device_batch": 32, "s_min": 1000, "step_time": 0.5},
    )
    assert r.status_code == 200, r.text
    plan = r.json()
    # doubling N speeds up by less than 1.5x past N* = (B_crit/b)(1 - 1.5/2)/(1.5 - 1)
    assert plan["device_limit"] == pytest.approx(2000 / 32 / 2)
    assert plan["limit_waste"] == pytest.approx(1 / 3)
    rows = {row["devices"]: row for row in plan["rows"]}
    assert rows[32]["doubling_speedup"] > 1.5 > rows[64]["doubling_speedup"]
    assert rows[1]["steps"] == pytest.approx(1000 * (1 + 2000 / 32))
    assert rows[1]["hours"] == pytest.approx(rows[1]["steps"] * 0.5 / 3600)
    # read at the rows: the last whose doubling paid (32 devices; the exact limit is 31.25)
    assert plan["paying_devices"] == 32
    assert [row["past_limit"] for row in plan["rows"]][5:7] == [False, True]
    assert plan["summary"] == (
        "Past 32 devices (1,024 examples per step) each doubling of devices speeds training "
        "up by less than 1.5×, and 34% of the compute there already goes beyond the minimum "
        "(B_crit = 2,000 examples)."
    )
    assert plan["reference"] == "B_crit"
    bads: tuple[dict[str, str | int], ...] = (
        {"b_crit": 0, "per_device_batch": 1},
        {"b_crit": 5, "per_device_batch": 1, "min_speedup": 2},
        {"b_crit": "nan", "per_device_batch": 1},
    )
    for bad in bads:
        assert client.get(f"{API}/parallelism", params=bad).status_code == 422


def test_parallelism_names_the_quantity_it_was_given(client: TestClient) -> None:
    """A B_simple passed as the critical batch size is called B_simple, taken as B_crit."""
    params: dict[str, str | int] = {
        "b_crit": 100,
        "per_device_batch": 16,
        "batch_size": 64,
        "reference": "B_simple",
    }
    r = client.get(f"{API}/parallelism", params=params)
    assert r.status_code == 200, r.text
    plan = r.json()
    assert plan["reference"] == "B_simple"
    assert plan["summary"] == (
        "Past 4 devices (64 examples per step) each doubling of devices speeds training up "
        "by less than 1.5×, and 39% of the compute there already goes beyond the minimum "
        "(B_crit ≈ B_simple = 100 examples)."
    )
    assert plan["verdict"].startswith("batch 64 is ~0.64× B_simple: near the balance point")
    one = client.get(f"{API}/parallelism", params={**params, "per_device_batch": 64}).json()
    assert "doubling pays 1.5×: B_crit ≈ B_simple = 100 examples, so" in one["summary"]
    r = client.get(f"{API}/parallelism", params={**params, "reference": "b_simple"})
    assert r.status_code == 422, r.text
    assert "'B_crit' or 'B_simple'" in r.text


def test_the_training_curve_weights_each_bucket_by_the_samples_that_carried_a_loss() -> None:
    # every step logs a loss for 1,000 steps, then every 10th: weighted by all samples, the
    # late buckets' few losses would count ten times over
    def bucket(i: int) -> BucketSums:
        n_loss = 100 if i < 10 else 10
        return BucketSums(
            "r",
            "",
            i,
            100,
            1.0,
            1.0,
            100 * i,
            100 * i + 99,
            None,
            None,
            3.0 - 0.1 * i,
            None,
            None,
            n_loss,
            False,
        )

    buckets = [bucket(i) for i in range(20)]
    middles = [(b.step_lo + b.step) / 2.0 for b in buckets]
    losses = [float(b.loss or 0.0) for b in buckets]
    steps, curve = sweeps._train_curve(buckets)
    assert (steps, curve) == training_loss_curve(middles, losses, [b.n_loss for b in buckets])
    assert curve != training_loss_curve(middles, losses, [b.n for b in buckets])[1]
