"""Synthetic runs whose noise scale and critical batch size are known in closed form.

Each sample's squared norms are built from eq. (1) of science.md, E|G_B|² = |G|² + tr(Σ)/B,
with a noise term that cancels over every pair of steps, so any window of an even number of
steps gives B_simple = tr(Σ)/|G|² exactly. Losses follow science.md's S-E model: a run at batch
B reaches loss L after S = S_min(L)(1 + B_crit/B) steps, so a sweep fits B_crit exactly.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import sqlalchemy as sa
from noisescope.estimators import two_batch_estimates
from noisescope_server.models import Base, Event, Project, Run, Sample, Task

#: B_crit of the "digits" sweep and B_simple of its runs (constant over each run).
DIGITS_B_CRIT = 200.0
DIGITS_B_SIMPLE = 100.0
DIGITS_BATCHES = (16, 32, 64, 128, 256, 512)
LM_LAYERS = ("layer0", "layer1")


@dataclass
class SynthRun:
    uid: str
    project: str
    task: str
    name: str
    batch_size: float
    steps: int
    units: str = "examples"
    status: str = "finished"
    tags: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    b_simple: float = DIGITS_B_SIMPLE
    b_crit: float = DIGITS_B_CRIT
    grow: bool = False
    layers: tuple[str, ...] = ()
    events: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)


def loss_at(step: float, batch: float, b_crit: float) -> float:
    """Loss after ``step`` steps at batch B: a function of step / (1 + B_crit/B) only."""
    equivalent = step / (1.0 + b_crit / batch)
    return 0.1 + 2.0 * math.exp(-equivalent / 40.0)


def steps_to_reach(target: float, batch: float, b_crit: float) -> float:
    """Inverse of ``loss_at``: S = S_min(L) (1 + B_crit/B), S_min(L) = 40 ln(2 / (L - 0.1))."""
    return 40.0 * math.log(2.0 / (target - 0.1)) * (1.0 + b_crit / batch)


def default_runs() -> list[SynthRun]:
    runs = [
        SynthRun(
            uid=f"digits{b:04d}" + "0" * 22,
            project="vision",
            task="digits",
            name=f"digits-b{b}",
            batch_size=float(b),
            steps=600,
            tags=["sweep", f"b{b}"],
            config={"lr": 0.1, "batch_size": b},
        )
        for b in DIGITS_BATCHES
    ]
    runs.append(
        SynthRun(
            uid="lm" + "0" * 30,
            project="nlp",
            task="lm",
            name="<b>lm</b> **run**",
            batch_size=4096.0,
            steps=400,
            units="tokens",
            status="running",
            tags=["<script>alert(1)</script>"],
            config={"model": "<i>tiny</i>", "layers": 2},
            b_simple=2000.0,
            b_crit=8000.0,
            grow=True,
            layers=LM_LAYERS,
            events=[(200, "batch_size_change", {"old_batch_size": 4096, "batch_size": 8192})],
        )
    )
    return runs


def insert_runs(url: str, runs: list[SynthRun]) -> None:
    engine = sa.create_engine(url)
    Base.metadata.create_all(engine)
    t0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
    with engine.begin() as conn:
        project_ids: dict[str, int] = {}
        task_ids: dict[tuple[str, str], int] = {}
        for i, r in enumerate(runs):
            if r.project not in project_ids:
                project_ids[r.project] = conn.execute(
                    sa.insert(Project).values(name=r.project, created_at=t0).returning(Project.id)
                ).scalar_one()
            pid = project_ids[r.project]
            if (r.project, r.task) not in task_ids:
                task_ids[(r.project, r.task)] = conn.execute(
                    sa.insert(Task).values(project_id=pid, name=r.task).returning(Task.id)
                ).scalar_one()
            run_id = conn.execute(
                sa.insert(Run)
                .values(
                    uid=r.uid,
                    project_id=pid,
                    task_id=task_ids[(r.project, r.task)],
                    name=r.name,
                    config=r.config,
                    tags=r.tags,
                    batch_size=r.batch_size,
                    units=r.units,
                    status=r.status,
                    started_at=t0 + timedelta(hours=i),
                    ended_at=None if r.status == "running" else t0 + timedelta(hours=i, minutes=30),
                    last_seen_at=t0 + timedelta(hours=i, minutes=30),
                )
                .returning(Run.id)
            ).scalar_one()
            conn.execute(sa.insert(Sample), list(_samples(run_id, r)))
            for step, kind, payload in r.events:
                conn.execute(
                    sa.insert(Event).values(
                        run_id=run_id, step=step, kind=kind, payload=payload, time=1000.0 + step
                    )
                )
    engine.dispose()


def _samples(run_id: int, r: SynthRun) -> Any:
    seq = 0
    b_small = r.batch_size / 4
    for step in range(1, r.steps + 1):
        batch = r.batch_size
        for event_step, _, payload in r.events:
            if step >= event_step and "batch_size" in payload:
                batch = float(payload["batch_size"])
        g_true_sq = 1.0 if not r.grow else 1.0 * math.exp(-step / 200.0)
        trace_sigma = r.b_simple * 1.0  # tr(Sigma) fixed; B_simple = tr(Sigma)/|G|^2
        wobble = 0.3 * g_true_sq * (1 if step % 2 else -1)  # cancels over each pair of steps
        for name in ("", *r.layers):
            scale = 1.0 if name == "" else 0.5
            g_small_sq = scale * (g_true_sq + wobble + trace_sigma / b_small)
            g_big_sq = scale * (g_true_sq + wobble + trace_sigma / batch)
            g_sq_est, ts_est = two_batch_estimates(b_small, batch, g_small_sq, g_big_sq)
            seq += 1
            yield {
                "run_id": run_id,
                "seq": seq,
                "step": step,
                "examples": float(step * batch),
                "b_small": b_small,
                "b_big": batch,
                "g_small_sq": g_small_sq,
                "g_big_sq": g_big_sq,
                "g_sq_est": g_sq_est,
                "trace_sigma_est": ts_est,
                "loss": loss_at(step, batch, r.b_crit),
                "lr": 0.1 * (1 - step / (2 * r.steps)),
                "time": 1000.0 + step * 0.5,
                "series": name,
            }


def new_uid() -> str:
    return uuid.uuid4().hex
