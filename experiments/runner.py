"""The batch-size sweep: train every (batch size, learning rate) pair, cache each finished run.

Resumable: each finished run is written atomically to ``<out>/<task>/B<b>_lr<lr>.json``; a
rerun loads it instead of training again. Every run is logged through the noisescope client
(``noisescope.init`` → ``Run.log_sample``), as a user's training loop would.

Learning rates for one batch size are tried nearest-first around the best lr of the previous
batch size. A run stops when (i) it reached the lowest loss target and ran ``window``× as many
steps again (so B_simple has a window on both sides of the crossing), (ii) it diverged, (iii) it
hit the step/example budget, or (iv) it is *pruned*: it passed the step at which an already
finished lr of the same batch size reached the lowest target. A pruned run cannot be the fastest
for any target (it has not reached the lowest one by then, and every higher target was reached
no later by that faster run), so pruning never changes the per-target best.
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

__all__ = ["OFFLINE", "Progress", "RunRecord", "load_runs", "run_sweep", "to_sweep_runs"]

INIT_SEED = 1234
EVAL_SPACING = 0.04  # evaluate every 4% of the steps so far (relative resolution)
DIVERGE_FACTOR = 3.0
WINDOW = 1.25
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


def _run_path(out: Path, spec: TaskSpec, batch_size: int, lr: float) -> Path:
    return task_dir(out, spec) / f"B{batch_size}_lr{lr:.6g}.json"


def train_one(
    spec: TaskSpec,
    batch_size: int,
    lr: float,
    prune_at: float | None,
    url: str | None,
    out: Path,
    progress: Progress,
    label: str,
) -> RunRecord:
    """Train one (batch size, lr) run and return its record (evaluations and noise samples)."""
    sampler_seed = zlib.crc32(f"{spec.name}-{batch_size}-{lr:.6g}".encode())
    trainer = make_trainer(spec, INIT_SEED, sampler_seed)
    tpe = spec.tokens_per_example
    units_per_step = batch_size * tpe
    lowest = min(spec.loss_targets)
    max_steps = min(spec.max_steps, math.ceil(spec.max_examples / batch_size))
    config = {
        "batch_size": batch_size,
        "batch_size_units": units_per_step,
        "lr": lr,
        "optimizer": spec.optimizer,
        "micro_batches": spec.micro_batches,
        "init_seed": INIT_SEED,
        "sampler_seed": sampler_seed,
    }
    logger = _Logger.open(url, out / "spool", spec, f"B{batch_size}-lr{lr:.6g}", config)
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
    guess = math.exp(sum(math.log(lr) for lr in spec.lrs) / len(spec.lrs))
    total = len(spec.batch_sizes) * len(spec.lrs)
    done = 0
    for batch_size in spec.batch_sizes:
        best_steps: float | None = None
        best_lr: float | None = None
        for lr in _lr_order(spec.lrs, guess):
            done += 1
            label = f"{spec.name} [{done}/{total}] B={batch_size} lr={lr:.3g}"
            path = _run_path(out, spec, batch_size, lr)
            if path.exists():
                record: RunRecord = json.loads(path.read_text())
                how = "cached"
            else:
                progress.update(f"{label} starting")
                record = train_one(spec, batch_size, lr, best_steps, url, out, progress, label)
                _save(path, record)
                how = f"{record['wall_s']:.1f}s"
            records.append(record)
            reached = record["reached_lowest_at"]
            progress.line(
                f"{label}: {record['status']} after {record['steps']} steps"
                + (f", loss {lowest:g} at step {reached:.0f}" if reached else "")
                + f" ({how})"
            )
            if reached is not None and (best_steps is None or reached < best_steps):
                best_steps, best_lr = reached, lr
            if on_run is not None:
                on_run(record)
        if best_lr is not None:
            guess = best_lr
    return records


def to_sweep_runs(records: list[RunRecord]) -> list[SweepRun]:
    """Records → the analysis module's generic runs (batch sizes in the task's units)."""
    runs = []
    for r in records:
        s = r["samples"]
        runs.append(
            SweepRun(
                run_id=f"B{r['batch_size']}-lr{r['lr']:.6g}",
                batch_size=float(r["batch_size_units"]),
                lr=float(r["lr"]),
                curve=LossCurve(r["evals"]["step"], r["evals"]["loss"]),
                samples=NoiseSamples(
                    s["step"], s["b_small"], s["b_big"], s["g_small_sq"], s["g_big_sq"]
                ),
            )
        )
    return runs


def load_runs(out: Path, spec: TaskSpec) -> list[RunRecord]:
    """All cached records of a task (for re-analysis without training)."""
    folder = task_dir(out, spec)
    return [json.loads(p.read_text()) for p in sorted(folder.glob("B*_lr*.json"))]
