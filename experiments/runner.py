"""The batch-size sweep: train every (batch size, learning rate) pair, cache each finished run.

Resumable: each finished run is written atomically to ``<out>/<task>-<settings hash>/``; a rerun
loads it instead of training again. Every run is logged through the noisescope client
(``noisescope.init`` → ``Run.log_sample``), as a user's training loop would.

Batch sizes are swept from the largest down; learning rates for one batch size are tried
nearest-first around the best lr of the previous (larger) batch size. A run stops when:

(i) it reached the lowest loss target and ran ``WINDOW``× as many steps again (so B_simple has a
window on both sides of the crossing); (ii) it diverged; (iii) it hit the task's step/example
cap; (iv) it is *pruned*: it passed the step at which an already finished lr of the same batch
size reached the lowest target (× the number of repeats). A pruned run cannot be the fastest for
any target (every higher target was reached no later by that faster run), so pruning never
changes the per-target best; (v) it ran out of *budget*: in the paper's model the examples to
reach a loss never grow as the batch shrinks (E = E_min(1 + B/B_crit)), so at batch B a run gets
CAP_FACTOR × E(B')/B steps, E(B') the fewest examples any larger batch needed; a run slower than
that is far off the model and is stopped.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from experiments.analysis import LossCurve, NoiseSamples, SweepRun, crossing_step
from experiments.tasks import TaskSpec, make_trainer

__all__ = [
    "OFFLINE",
    "Progress",
    "RunRecord",
    "load_runs",
    "run_name",
    "run_sweep",
    "to_sweep_runs",
]

INIT_SEED = 1234
EVAL_SPACING = 0.04  # evaluate every 4% of the steps so far (relative resolution)
DIVERGE_FACTOR = 3.0
WINDOW = 1.25
#: Budget for a batch size B, from the previously swept larger batch B' (see run_sweep).
CAP_FACTOR = 3.0
#: Pass as ``url`` to log through the client in offline mode (spooled; ``noisescope sync``).
OFFLINE = "offline"

RunRecord = dict[str, Any]


class Progress:
    """One line per finished run, and a live status line on a terminal."""

    def __init__(self, stream: TextIO = sys.stderr) -> None:
        self.stream = stream
        self.live = stream.isatty()
        self._last = 0.0
        self.t0 = time.monotonic()

    def _elapsed(self) -> str:
        s = int(time.monotonic() - self.t0)
        return f"{s // 60:02d}:{s % 60:02d}"

    def update(self, text: str) -> None:
        now = time.monotonic()
        if self.live and now - self._last > 0.5:
            self._last = now
            self.stream.write(f"\r\x1b[K[{self._elapsed()}] {text}")
            self.stream.flush()

    def line(self, text: str) -> None:
        if self.live:
            self.stream.write("\r\x1b[K")
        self.stream.write(f"[{self._elapsed()}] {text}\n")
        self.stream.flush()


@dataclass
class _Logger:
    """The noisescope client run for one training run (or nothing when url is None)."""

    run: Any

    @classmethod
    def open(
        cls, url: str | None, spool: Path, spec: TaskSpec, name: str, config: dict[str, Any]
    ) -> _Logger:
        if url is None:
            return cls(None)
        import noisescope

        offline = url == OFFLINE
        run = noisescope.init(
            url=None if offline else url,
            mode="offline" if offline else "online",
            project="noisescope-reproduction",
            task=spec.name,
            name=name,
            config=config,
            batch_size=config["batch_size_units"],
            units=spec.units,
            dir=str(spool),
            quiet=True,
        )
        return cls(run)

    def sample(self, step: int, res: Any, examples: float, lr: float) -> None:
        if self.run is not None:
            self.run.log_sample(
                step,
                res.b_small,
                res.b_big,
                res.g_small_sq,
                res.g_big_sq,
                examples=examples,
                loss=res.loss,
                lr=lr,
            )

    def finish(self, status: str) -> dict[str, Any]:
        if self.run is None:
            return {}
        result = self.run.finish(status="finished" if status != "failed" else "failed")
        return {k: getattr(result, k) for k in ("sent", "spooled", "dropped") if hasattr(result, k)}


def task_dir(out: Path, spec: TaskSpec) -> Path:
    """Cache folder per task *and* settings: changing a spec never reuses stale runs."""
    fields = (
        spec.loss_targets,
        spec.max_steps,
        spec.max_examples,
        spec.micro_batches,
        spec.tokens_per_example,
        spec.description,
        INIT_SEED,
        EVAL_SPACING,
        WINDOW,
        DIVERGE_FACTOR,
    )
    return out / f"{spec.name}-{zlib.crc32(repr(fields).encode()):08x}"


def run_name(batch_size: int, lr: float, seed: int) -> str:
    return f"B{batch_size}-lr{lr:.6g}-s{seed}"


def _run_path(out: Path, spec: TaskSpec, batch_size: int, lr: float, seed: int) -> Path:
    return task_dir(out, spec) / f"{run_name(batch_size, lr, seed)}.json"


def train_one(
    spec: TaskSpec,
    batch_size: int,
    lr: float,
    seed: int,
    prune_at: float | None,
    budget_at: float | None,
    url: str | None,
    out: Path,
    progress: Progress,
    label: str,
) -> RunRecord:
    """Train one (batch size, lr) run and return its record (evaluations and noise samples)."""
    sampler_seed = zlib.crc32(f"{spec.name}-{batch_size}-{lr:.6g}-{seed}".encode())
    trainer = make_trainer(spec, INIT_SEED + seed, sampler_seed)
    tpe = spec.tokens_per_example
    units_per_step = batch_size * tpe
    lowest = min(spec.loss_targets)
    max_steps = _max_steps(spec, batch_size)
    config = {
        "batch_size": batch_size,
        "batch_size_units": units_per_step,
        "lr": lr,
        "optimizer": spec.optimizer,
        "micro_batches": spec.micro_batches,
        "init_seed": INIT_SEED + seed,
        "sampler_seed": sampler_seed,
    }
    logger = _Logger.open(url, out / "spool", spec, run_name(batch_size, lr, seed), config)
    first = trainer.eval_loss()
    evals: dict[str, list[float]] = {"step": [0.0], "loss": [first]}
    for key, value in trainer.truth().items():
        evals[key] = [value]
    samples: dict[str, list[float]] = {
        k: [] for k in ("step", "b_small", "b_big", "g_small_sq", "g_big_sq", "loss")
    }
    status = "budget"
    stop_at: int | None = None
    reached_at: float | None = None
    next_eval = 1
    t0 = time.monotonic()
    step = 0
    try:
        for step in range(1, max_steps + 1):
            res = trainer.step(batch_size, lr)
            for key in samples:
                samples[key].append(float(step) if key == "step" else float(getattr(res, key)))
            logger.sample(step, res, float(step * units_per_step), lr)
            if step >= next_eval or step == max_steps:
                loss = trainer.eval_loss()
                evals["step"].append(float(step))
                evals["loss"].append(loss)
                for key, value in trainer.truth().items():
                    evals[key].append(value)
                next_eval = step + max(1, int(step * EVAL_SPACING))
                progress.update(f"{label} step {step}/{max_steps} loss {loss:.4g}")
                if not math.isfinite(loss) or loss > DIVERGE_FACTOR * first:
                    status = "diverged"
                    break
                if reached_at is None and loss <= lowest:
                    reached_at = crossing_step(evals["step"], evals["loss"], lowest)
                    stop_at = math.ceil((reached_at or step) * WINDOW)
            if stop_at is not None and step >= stop_at:
                status = "reached"
                break
            if reached_at is None and prune_at is not None and step > prune_at:
                status = "pruned"
                break
            if reached_at is None and budget_at is not None and step > budget_at:
                status = "budget"
                break
        else:
            if reached_at is not None:
                status = "reached"
    except Exception:
        logger.finish("failed")
        raise
    sent = logger.finish(status)
    return {
        "task": spec.name,
        "batch_size": batch_size,
        "batch_size_units": units_per_step,
        "units": spec.units,
        "lr": lr,
        "seed": seed,
        "status": status,
        "steps": step,
        "reached_lowest_at": reached_at,
        "wall_s": time.monotonic() - t0,
        "config": config,
        "client": sent,
        "evals": evals,
        "samples": samples,
    }


def _save(path: Path, record: RunRecord) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)


def _max_steps(spec: TaskSpec, batch_size: int) -> int:
    return min(spec.max_steps, math.ceil(spec.max_examples / batch_size))


def _stopped_short(
    record: RunRecord, spec: TaskSpec, prune_at: float | None, budget_at: float | None
) -> bool:
    """A cached run cut by a tighter prune/budget bound than today's must be trained again."""
    steps = float(record["steps"])
    if record["status"] == "pruned":
        return prune_at is None or steps < prune_at
    if record["status"] == "budget" and record["reached_lowest_at"] is None:
        if steps >= _max_steps(spec, int(record["batch_size"])):
            return False
        return budget_at is None or steps < budget_at
    return False


def _lr_order(lrs: tuple[float, ...], guess: float) -> list[float]:
    """Nearest-first around ``guess`` (ties: the larger lr first)."""
    return sorted(lrs, key=lambda lr: (round(abs(math.log(lr / guess)), 9), -lr))


def run_sweep(
    spec: TaskSpec,
    out: Path,
    url: str | None,
    progress: Progress,
    on_run: Callable[[RunRecord], None] | None = None,
) -> list[RunRecord]:
    """Every batch size × lr of ``spec`` (cached runs are loaded, not retrained)."""
    records: list[RunRecord] = []
    lowest = min(spec.loss_targets)
    guess = max(spec.lrs)
    total = len(spec.batch_sizes) * len(spec.lrs) * spec.seeds
    done = 0
    examples_needed: float | None = None
    for batch_size in sorted(spec.batch_sizes, reverse=True):
        budget_at = None if examples_needed is None else CAP_FACTOR * examples_needed / batch_size
        best_steps: float | None = None
        best_lr: float | None = None
        for lr in _lr_order(spec.lrs, guess):
            # With n repeats a run slower than n x the best mean cannot give a better mean.
            prune_at = None if best_steps is None else best_steps * spec.seeds
            reached_all: list[float] = []
            for seed in range(spec.seeds):
                done += 1
                label = f"{spec.name} [{done}/{total}] B={batch_size} lr={lr:.3g} seed={seed}"
                path = _run_path(out, spec, batch_size, lr, seed)
                record: RunRecord | None = None
                if path.exists():
                    record = json.loads(path.read_text())
                    if _stopped_short(record, spec, prune_at, budget_at):
                        record = None
                    else:
                        how = "cached"
                if record is None:
                    progress.update(f"{label} starting")
                    record = train_one(
                        spec, batch_size, lr, seed, prune_at, budget_at, url, out, progress, label
                    )
                    _save(path, record)
                    how = f"{record['wall_s']:.1f}s"
                records.append(record)
                reached = record["reached_lowest_at"]
                if reached is not None:
                    reached_all.append(reached)
                progress.line(
                    f"{label}: {record['status']} after {record['steps']} steps"
                    + (f", loss {lowest:g} at step {reached:.0f}" if reached else "")
                    + f" ({how})"
                )
                if on_run is not None:
                    on_run(record)
            if len(reached_all) == spec.seeds:
                mean = sum(reached_all) / len(reached_all)
                if best_steps is None or mean < best_steps:
                    best_steps, best_lr = mean, lr
        if best_lr is not None and best_steps is not None:
            guess = best_lr
            needed = best_steps * batch_size
            examples_needed = needed if examples_needed is None else min(examples_needed, needed)
    return records


def to_sweep_runs(records: list[RunRecord]) -> list[SweepRun]:
    """Records → the analysis module's generic runs (batch sizes in the task's units)."""
    runs = []
    for r in records:
        s = r["samples"]
        runs.append(
            SweepRun(
                run_id=run_name(r["batch_size"], r["lr"], r.get("seed", 0)),
                batch_size=float(r["batch_size_units"]),
                lr=float(r["lr"]),
                curve=LossCurve(r["evals"]["step"], r["evals"]["loss"]),
                samples=NoiseSamples(
                    s["step"], s["b_small"], s["b_big"], s["g_small_sq"], s["g_big_sq"]
                ),
                seed=int(r.get("seed", 0)),
            )
        )
    return runs


def load_runs(out: Path, spec: TaskSpec) -> list[RunRecord]:
    """All cached records of a task (for re-analysis without training)."""
    folder = task_dir(out, spec)
    return [json.loads(p.read_text()) for p in sorted(folder.glob("B*-lr*-s*.json"))]
