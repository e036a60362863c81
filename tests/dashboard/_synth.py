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

from noisescope_server import crud
from noisescope_server.db import make_engine, upgrade

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
    """Write runs through the server's one write path (``crud``) after migrating to head."""
    engine = make_engine(url)
    upgrade(engine)
    t0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
    for i, r in enumerate(runs):
        crud.upsert_run(
            engine,
            r.uid,
            crud.RunIn(
                project=r.project,
                task=r.task,
                name=r.name,
                config=r.config,
                tags=r.tags,
                batch_size=r.batch_size,
                units=r.units,
                status="running",
                started_at=t0 + timedelta(hours=i),
            ),
        )
        rows = list(_samples(r))
        for lo in range(0, len(rows), 20_000):
            chunk = rows[lo : lo + 20_000]
            columns = {k: [row[k] for row in chunk] for k in chunk[0]}
            crud.ingest_samples(engine, r.uid, crud.validate_samples({"columns": columns}))
        if r.events:
            crud.ingest_events(
                engine,
                r.uid,
                [
                    crud.EventIn(step=step, kind=kind, payload=payload)
                    for step, kind, payload in r.events
                ],
            )
        if r.status != "running":
            crud.patch_run(engine, r.uid, status=r.status)
    engine.dispose()


def _samples(r: SynthRun) -> Any:
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
            seq += 1
            yield {
                "seq": seq,
                "step": step,
                "examples": float(step * batch),
                "b_small": b_small,
                "b_big": batch,
                "g_small_sq": g_small_sq,
                "g_big_sq": g_big_sq,
                "loss": loss_at(step, batch, r.b_crit),
                "lr": 0.1 * (1 - step / (2 * r.steps)),
                "time": 1000.0 + step * 0.5,
                "series": name,
            }


def new_uid() -> str:
    return uuid.uuid4().hex
