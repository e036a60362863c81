"""Synthetic runs whose noise scale and critical batch size are known in closed form.

Each sample's squared norms are built from eq. (1) of docs/science.md, E|G_B|² = |G|² + tr(Σ)/B,
with a noise term that cancels over every pair of steps, so a window of an even number of
steps gives B_simple = tr(Σ)/|G|² exactly. Losses follow docs/science.md's S-E model: a run at batch
B with its best learning rate reaches loss L after S = S_min(L)(1 + B_crit/B) steps, so a sweep
fits B_crit; the other learning rates of a sweep are slower, so the frontier must skip them.
Sweep runs log evaluation losses (``eval`` events) on the same curve, so crossings are exact.
Everything is written through the server's one write path (``crud``).
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from functools import partial
from typing import Any

from noisescope_server import crud
from noisescope_server.db import make_engine, upgrade

#: The "vision/digits" sweep: B_crit, B_simple of its runs (constant), batch sizes and the
#: learning rates run at each (BEST_LR is the fastest; the others reach a loss later).
DIGITS_B_CRIT = 200.0
DIGITS_B_SIMPLE = 100.0
DIGITS_BATCHES = (16, 32, 64, 128, 256, 512)
BEST_LR = 0.1
#: Learning rate -> how much slower than the best one it trains (steps to a loss x this).
LR_SLOWDOWN = {0.05: 1.6, BEST_LR: 1.0, 0.4: 1.25}
#: The "nlp/lm-sweep" sweep, in tokens.
LM_B_CRIT = 8000.0
LM_B_SIMPLE = 6000.0
LM_BATCHES = (1024, 2048, 4096, 8192, 16384, 32768)
LM_LAYERS = ("layer0", "layer1")
#: Every this many steps a sweep run logs an evaluation loss.
EVAL_EVERY = 20

DIGITS64 = "digits0064" + "0" * 22
LM = "lm" + "0" * 30
NOTICE = "notice" + "0" * 26
SHORT = "short" + "0" * 27
NOTICE_MESSAGE = (
    "not measuring this run: one process and accumulate_grad_batches=1 give a single batch "
    "size per step; set accumulate_grad_batches > 1 or use DDP on several devices"
)
HOSTILE_TASK = "[a](javascript:alert(1))"


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
    #: Steps to any loss are this many times the S-E model's (a slower learning rate).
    slowdown: float = 1.0
    grow: bool = False
    layers: tuple[str, ...] = ()
    events: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)
    evals: bool = False
    samples: bool = True


def loss_at(step: float, batch: float, b_crit: float, slowdown: float = 1.0) -> float:
    """Loss after ``step`` steps at batch B: a function of step / (1 + B_crit/B) only."""
    equivalent = step / (slowdown * (1.0 + b_crit / batch))
    return 0.1 + 2.0 * math.exp(-equivalent / 40.0)


def steps_to_reach(target: float, batch: float, b_crit: float) -> float:
    """Inverse of ``loss_at``: S = S_min(L) (1 + B_crit/B), S_min(L) = 40 ln(2 / (L - 0.1))."""
    return 40.0 * math.log(2.0 / (target - 0.1)) * (1.0 + b_crit / batch)


def _uid(prefix: str, batch: int, lr_index: int) -> str:
    if lr_index == 1 and prefix == "digits":
        return f"digits{batch:04d}" + "0" * 22
    return f"{prefix}{batch:05d}lr{lr_index}".ljust(32, "0")


def sweep_runs() -> list[SynthRun]:
    """vision/digits at 6 batch sizes x 3 learning rates; nlp/lm-sweep at 6 batch sizes."""
    runs = [
        SynthRun(
            uid=_uid("digits", b, i),
            project="vision",
            task="digits",
            name=f"digits-b{b}-lr{lr:g}",
            batch_size=float(b),
            steps=600,
            tags=["sweep", f"b{b}"],
            config={"lr": lr, "batch_size": b},
            slowdown=slow,
            evals=True,
        )
        for b in DIGITS_BATCHES
        for i, (lr, slow) in enumerate(LR_SLOWDOWN.items())
    ]
    runs += [
        SynthRun(
            uid=_uid("lmsweep", b, 0),
            project="nlp",
            task="lm-sweep",
            name=f"lm-sweep-{b // 1024}k-tokens",
            batch_size=float(b),
            steps=400,
            units="tokens",
            tags=["sweep"],
            config={"lr": 0.001, "batch_size_tokens": b},
            b_simple=LM_B_SIMPLE,
            b_crit=LM_B_CRIT,
            evals=True,
        )
        for b in LM_BATCHES
    ]
    return runs


def default_runs() -> list[SynthRun]:
    """The sweeps, a live token run named with HTML/Markdown, a short run, a run that measured
    nothing and said why (a notice), under a task named like a Markdown link."""
    runs = sweep_runs()
    lm_run = partial(SynthRun, project="nlp", task="lm", units="tokens")
    runs.append(
        lm_run(
            uid=LM,
            name="<b>lm</b> **run**",
            batch_size=4096.0,
            steps=400,
            status="running",
            tags=["<script>alert(1)</script>", "**bold**"],
            config={"model": "<i>tiny</i>", "layers": 2, "note": "[a](javascript:alert(1))"},
            b_simple=2000.0,
            b_crit=8000.0,
            grow=True,
            layers=LM_LAYERS,
            events=[
                (200, "batch_size", {"old_batch_size": 4096, "batch_size": 8192}),
                (300, "checkpoint", {"path": "<b>ckpt</b>"}),
            ],
            evals=True,
        )
    )
    runs.append(lm_run(uid=SHORT, name="lm-short", batch_size=2048.0, steps=40, b_simple=2000.0))
    runs.append(
        SynthRun(
            uid=NOTICE,
            project="vision",
            task=HOSTILE_TASK,
            name="lightning-no-accumulation",
            batch_size=32.0,
            steps=0,
            samples=False,
            events=[(0, "notice", {"message": NOTICE_MESSAGE})],
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
        rows = list(_samples(r)) if r.samples else []
        for lo in range(0, len(rows), 20_000):
            chunk = rows[lo : lo + 20_000]
            columns = {k: [row[k] for row in chunk] for k in chunk[0]}
            crud.ingest_samples(engine, r.uid, crud.validate_samples({"columns": columns}))
        events = [crud.EventIn(step=s, kind=k, payload=p) for s, k, p in r.events]
        if r.evals:
            events += [
                crud.EventIn(
                    step=s,
                    kind="eval",
                    payload={"loss": loss_at(s, _batch_at(r, s), r.b_crit, r.slowdown)},
                    time=1000.0 + s * 0.5,
                )
                for s in range(EVAL_EVERY, r.steps + 1, EVAL_EVERY)
            ]
        if events:
            crud.ingest_events(engine, r.uid, events)
        if r.status != "running":
            crud.patch_run(engine, r.uid, status=r.status)
    engine.dispose()


def _batch_at(r: SynthRun, step: int) -> float:
    """The batch in use at ``step``: the run's, or its latest batch-size change."""
    batch = r.batch_size
    for event_step, kind, payload in r.events:
        if kind == "batch_size" and step >= event_step:
            batch = float(payload["batch_size"])
    return batch


#: Per-layer (|G|^2, tr(Sigma)) scales: layer0's B_simple is half the model's, layer1's double.
LAYER_SCALES = {"": (1.0, 1.0), "layer0": (0.7, 0.35), "layer1": (0.3, 0.6)}


def _samples(r: SynthRun) -> Any:
    seq = 0
    b_small = r.batch_size / 4
    seen = 0.0
    for step in range(1, r.steps + 1):
        batch = _batch_at(r, step)
        seen += batch
        g_true_sq = 1.0 if not r.grow else 1.0 * math.exp(-step / 200.0)
        trace_sigma = r.b_simple * 1.0  # tr(Sigma) fixed; B_simple = tr(Sigma)/|G|^2
        wobble = 0.3 * g_true_sq * (1 if step % 2 else -1)  # cancels over each pair of steps
        for name in ("", *r.layers):
            g_scale, s_scale = LAYER_SCALES.get(name, (0.5, 0.5))
            g = g_scale * (g_true_sq + wobble)
            g_small_sq = g + s_scale * trace_sigma / b_small
            g_big_sq = g + s_scale * trace_sigma / batch
            seq += 1
            yield {
                "seq": seq,
                "step": step,
                "examples": seen,
                "b_small": b_small,
                "b_big": batch,
                "g_small_sq": g_small_sq,
                "g_big_sq": g_big_sq,
                "loss": loss_at(step, batch, r.b_crit, r.slowdown),
                "lr": float(r.config.get("lr", 0.1)) * (1 - step / (2 * r.steps)),
                "time": 1000.0 + step * 0.5,
                "series": name,
            }


def new_uid() -> str:
    return uuid.uuid4().hex
