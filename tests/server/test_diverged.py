"""A run whose loss diverged reads ``diverged`` (with why) in ``GET /runs/{id}`` and ``GET /runs``,
through the real server on SQLite and PostgreSQL; a run that trained well does not."""

from __future__ import annotations

import dataclasses
import uuid

from starlette.testclient import TestClient

from harness.synthetic_sweep import L0, SynthRun, make_sweep, post

API = "/api/v1"


@dataclasses.dataclass(frozen=True)
class _BlowUp(SynthRun):
    """Falls like the model's loss until 40% of its steps, then climbs above where it started."""

    def loss(self, step: float) -> float:
        turn = 0.4 * self.steps
        if step <= turn:
            return super().loss(step)
        return super().loss(turn) + (step - turn) / (self.steps - turn) * L0


def test_a_diverged_run_is_flagged_beside_its_status(client: TestClient) -> None:
    project = f"diverged-{uuid.uuid4().hex[:8]}"
    good, other = make_sweep(200.0, (64, 256), lrs=((0.3, 1.0),))
    blown = _BlowUp(**dataclasses.asdict(other))
    post(client, [good], project=project, task="evals")  # evaluation curves
    post(client, [blown], project=project, task="evals")
    trained = _BlowUp(**dataclasses.asdict(good) | {"uid": uuid.uuid4().hex})
    post(client, [trained], project=project, task="train", evals=False)  # training loss only
    listed = client.get(f"{API}/runs", params={"project": project}).json()
    by_task = {(r["task"], r["uid"]): r for r in listed}
    clean = by_task[("evals", good.uid)]
    assert clean["diverged"] is False and clean["diverged_reason"] is None
    for task, uid, curve in (
        ("evals", blown.uid, "evaluation loss"),
        ("train", trained.uid, "training loss (smoothed)"),
    ):
        row = by_task[(task, uid)]
        assert row["status"] == "finished"  # the lifecycle is unchanged; the flag is beside it
        assert row["diverged"] is True
        assert row["diverged_reason"].startswith(f"{curve}: its loss rose from")
        one = client.get(f"{API}/runs/{uid}").json()
        assert one["diverged"] is True and one["diverged_reason"] == row["diverged_reason"]
