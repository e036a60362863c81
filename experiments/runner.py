"""The batch-size sweep: train every (batch size, learning rate) pair, cache each finished run.

Resumable: each finished run is written atomically to ``<out>/<task>-<settings hash>/``; a rerun
loads it instead of training again. Every run is logged through the noisescope client
(``noisescope.init`` → ``Run.log_sample`` per step, ``Run.log(step, eval_loss=...)`` per
evaluation), as a user's training loop would.

Batch sizes are swept from the largest down; at each, the lr grid is searched locally from the
best lr of the previous (larger) batch size (``run_sweep``). A run stops when:

(i) it reached the lowest loss target and ran ``WINDOW``× as many steps again (so B_simple has a
window on both sides of the crossing); (ii) it diverged; (iii) it hit the task's step/example
cap; (iv) it is *pruned*: it passed P, the steps an already finished lr of the same batch size
took to the lowest target (median over its seeds, as ``noisescope.sweep.frontier`` ranks them),
without reaching it. Pruning only turns crossings later than P into "never"; that can move its
lr's median only when the median was above P already, while the lr that set P reaches every
(higher) target within P. So pruning never changes the frontier; (v) it ran out of *budget*:
in the paper's model the examples to reach a loss never grow as the batch shrinks
(E = E_min(1 + B/B_crit)), so at batch B a run gets CAP_FACTOR × E(B')/B steps, E(B') the fewest
examples any larger batch needed; a run slower than that is far off the model and is stopped.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from experiments.analysis import run_name, to_sweep_runs
from experiments.tasks import PROJECT, TaskSpec, make_trainer
from noisescope import _progress
from noisescope.sweep import (
    B_SIMPLE_WINDOW,
    TARGETS_CONFIG_KEY,
    SweepRun,
    crossing_step,
    frontier,
)

if TYPE_CHECKING:
    from noisescope import Api

__all__ = [
    "CACHE_CONFIG_KEY",
    "OFFLINE",
    "PROJECT",
    "Progress",
    "RunRecord",
    "Stale",
    "archive_stale",
    "ensure_logged",
    "load_runs",
    "run_sweep",
]

INIT_SEED = 1234
EVAL_SPACING = 0.04  # evaluate every 4% of the steps so far (relative resolution)
DIVERGE_FACTOR = 3.0
#: Steps run past the crossing of the lowest target: B_simple's window there is complete.
WINDOW = B_SIMPLE_WINDOW
#: Budget for a batch size B, from the previously swept larger batch B' (see run_sweep).
CAP_FACTOR = 3.0
#: Pass as ``url`` to log through the client in offline mode (spooled; ``noisescope sync``).
OFFLINE = "offline"

RunRecord = dict[str, Any]


class Progress:
    """One line per finished run, and a live status line on a terminal."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr  # the stderr of now, not of import time
        self.live = self.stream.isatty()
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
        cls, url: str | None, out: Path, spec: TaskSpec, name: str, config: dict[str, Any]
    ) -> _Logger:
        if url is None:
            return cls(None)
        import noisescope

        offline = url == OFFLINE
        run = noisescope.init(
            url=None if offline else url,
            mode="offline" if offline else "online",
            project=spec.project,
            task=spec.name,
            name=name,
            config=logged_config(spec, config, out),
            batch_size=config["batch_size_units"],
            units=spec.units,
            dir=str(out / "spool"),
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

    def eval(self, step: int, loss: float, examples: float) -> None:
        """An evaluation, sent live: the server crosses loss targets on the same losses."""
        if self.run is not None and math.isfinite(loss):
            self.run.log(step, eval_loss=loss, examples=examples)

    def finish(self, status: str) -> dict[str, Any]:
        if self.run is None:
            return {}
        result = self.run.finish(status="finished" if status != "failed" else "failed")
        return {"sent": result.sent, "spooled": result.spooled, "dropped": result.dropped}


def logged_config(spec: TaskSpec, config: dict[str, Any], out: Path) -> dict[str, Any]:
    """A run's config as logged to the server: with the task's loss targets under
    ``sweep.TARGETS_CONFIG_KEY``, the targets this study analyses the sweep at, so the
    dashboard's pages and ``Api.critical_batch`` default to the same ones
    (``sweep.declared_targets``) and show the numbers printed here; and with the run cache
    that wrote it under ``CACHE_CONFIG_KEY``, the runs ``archive_stale`` may archive."""
    return {**config, TARGETS_CONFIG_KEY: list(spec.loss_targets), CACHE_CONFIG_KEY: _cache(out)}


#: The run-config key naming the run cache (``--out``) a run was logged from.
CACHE_CONFIG_KEY = "experiments_run_cache"


def _cache(out: Path) -> str:
    return str(out.resolve())


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
    logger = _Logger.open(url, out, spec, run_name(batch_size, lr, seed), config)
    first = trainer.eval_loss()
    logger.eval(0, first, 0.0)
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
                logger.eval(step, loss, float(step * units_per_step))
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
        "run_id": logger.run.id if logger.run is not None else None,
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


def ensure_logged(
    records: list[RunRecord], spec: TaskSpec, url: str, out: Path, progress: Progress
) -> int:
    """Make sure the server has every cached run; re-send missing ones from the cache.

    A run is normally on the server already (logged live, or spooled offline and delivered by
    ``noisescope.sync``). A cached run whose data never arrived (its spool was lost, the
    database was replaced) is sent again through the same client API, with the same run id,
    the recorded samples and evaluations. Returns how many runs were re-sent.
    """
    import requests

    resent = 0
    for record in records:
        name = run_name(record["batch_size"], record["lr"], record.get("seed", 0))
        run_id = _run_id(record, spec, out)
        answer = requests.get(f"{url}/api/v1/runs/{run_id}", timeout=30)
        if answer.status_code == 200:
            continue
        import noisescope

        run = noisescope.init(
            url=url,
            project=spec.project,
            task=spec.name,
            name=name,
            config=logged_config(spec, record["config"], out),
            batch_size=record["batch_size_units"],
            units=spec.units,
            run_id=run_id,
            dir=str(out / "spool"),
            quiet=True,
        )
        sm = record["samples"]
        per_step = record["batch_size_units"]
        for i, step in enumerate(sm["step"]):
            run.log_sample(
                int(step),
                sm["b_small"][i],
                sm["b_big"][i],
                sm["g_small_sq"][i],
                sm["g_big_sq"][i],
                examples=step * per_step,
                loss=sm["loss"][i],
                lr=record["lr"],
            )
        for step, loss in zip(record["evals"]["step"], record["evals"]["loss"], strict=True):
            if math.isfinite(loss):
                run.log(int(step), eval_loss=loss, examples=step * per_step)
        run.finish()
        resent += 1
        progress.update(f"{spec.name}: re-sent {name} from the cache")
    return resent


def _run_id(record: RunRecord, spec: TaskSpec, out: Path) -> str:
    """A cached run's id on the server: the one it was logged under, else the one
    ``ensure_logged`` re-sends it under."""
    name = run_name(record["batch_size"], record["lr"], record.get("seed", 0))
    logged: str | None = record.get("run_id")
    return logged or uuid.uuid5(uuid.NAMESPACE_URL, f"{out}/{spec.name}/{name}").hex


def archive_stale(records: list[RunRecord], spec: TaskSpec, api: Api, out: Path) -> Stale:
    """Archive the server's runs of this task that this run cache wrote (``CACHE_CONFIG_KEY``)
    but no longer holds: runs of an earlier version of the task (its trainer or settings
    changed, so its cache folder did), which would otherwise enter the server's critical batch
    beside this sweep's. Archived, not deleted (``noisescope runs restore`` brings one back).
    The task's other runs (logged by hand, by another checkout, or before runs named their
    cache) are never archived: ``Stale.foreign`` counts them for a line that says so."""
    kept = {_run_id(r, spec, out) for r in records}
    mine = _cache(out)
    stale: list[str] = []
    foreign = 0
    for r in api.runs(project=spec.project, task=spec.name, current=False):
        if r.uid in kept or r.parent_uid is not None:
            continue
        if r.config.get(CACHE_CONFIG_KEY) == mine:
            stale.append(r.uid)
        else:
            foreign += 1
    for run_id in stale:
        api.archive_run(run_id)
    return Stale(len(stale), foreign)


@dataclass(frozen=True)
class Stale:
    """What ``archive_stale`` did: runs archived, and the task's runs it left alone."""

    archived: int
    foreign: int


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


@dataclass
class _Sweep:
    """State of one task's sweep: where runs go, what was trained, the best lr at this B."""

    spec: TaskSpec
    out: Path
    url: str | None
    progress: Progress
    on_run: Callable[[RunRecord], None] | None
    records: list[RunRecord]
    #: Runs done of the sweep's estimated total (``run_sweep`` corrects it at each batch size).
    count: _progress.Progress
    done: int = 0
    batch_size: int = 0
    budget_at: float | None = None
    best_steps: float | None = None
    best_lr: float | None = None
    #: Every run at the current batch size (all its learning rates and repeats), as the
    #: frontier reads them.
    at_size: list[SweepRun] = field(default_factory=list)

    def evaluate(self, lr: float) -> bool:
        """Train (or load) every repeat of (batch size, lr); True if it is now the fastest
        learning rate at this batch size for some loss target.

        Learning rates are ranked as ``noisescope.sweep.frontier`` ranks them: the median steps
        over repeats, a repeat that never got there counting as infinitely slow. The best median
        at the lowest target is the prune bound (see the module docstring). "Some target", not
        only the lowest: a larger rate is often fastest to the higher targets, and the search
        must step past it, or that target's frontier point sits at the edge of what was tried.
        """
        spec, b = self.spec, self.batch_size
        lowest = min(spec.loss_targets)
        prune_at = self.best_steps
        mine: list[RunRecord] = []
        for seed in range(spec.seeds):
            self.done += 1
            of = f"{'~' if self.count.approx else ''}{max(self.count.total, self.done)}"
            label = f"{spec.name} [{self.done}/{of}] B={b} lr={lr:.3g} seed={seed}"
            path = _run_path(self.out, spec, b, lr, seed)
            record: RunRecord | None = None
            how = "cached"
            if path.exists():
                record = json.loads(path.read_text())
                if _stopped_short(record, spec, prune_at, self.budget_at):
                    record = None
            if record is None:
                self.progress.update(f"{label} starting")
                record = train_one(
                    spec, b, lr, seed, prune_at, self.budget_at, self.url, self.out,
                    self.progress, label,
                )  # fmt: skip
                _save(path, record)
                how = f"{record['wall_s']:.1f}s"
            self.records.append(record)
            mine.append(record)
            reached = record["reached_lowest_at"]
            self.count.advance(timed=how != "cached")
            more = self.progress.live and self.count.done < self.count.total  # quiet in a log
            left = self.count.left_s() if more else None
            self.progress.line(
                f"{label}: {record['status']} after {record['steps']} steps"
                + (f", loss {lowest:g} at step {reached:.0f}" if reached else "")
                + f" ({how})"
                + (f", about {_progress.duration(left)} left" if left is not None else "")
            )
            if self.on_run is not None:
                self.on_run(record)
        runs = to_sweep_runs(mine)
        self.at_size += runs
        points, _ = frontier(runs, lowest)
        if points and (self.best_steps is None or points[0].steps < self.best_steps):
            self.best_steps, self.best_lr = points[0].steps, lr
        fastest = set()
        for target in spec.loss_targets:
            at_target, _ = frontier(self.at_size, target)
            fastest |= {p.lr for p in at_target if p.lr is not None}
        return any(math.isclose(lr, f, rel_tol=1e-9) for f in fastest)


def run_sweep(
    spec: TaskSpec,
    out: Path,
    url: str | None,
    progress: Progress,
    on_run: Callable[[RunRecord], None] | None = None,
) -> list[RunRecord]:
    """The sweep of ``spec``: batch sizes largest first, a local lr search at each.

    At each batch size the grid is searched from the previous batch size's best lr: upward
    (larger lr) while the new rate is the fastest to some loss target, then downward from the
    start likewise (and downward also while no lr has reached the lowest target yet: too large
    an lr stalls above it). So every frontier point has a slower rate tried on each side of it,
    or sits at the end of the grid (widen it), or below a rate that diverged (the stability
    edge). Cached runs are loaded, not retrained.
    """
    sizes = sorted(spec.batch_sizes, reverse=True)
    per_size = min(3, len(spec.lrs)) * spec.seeds  # a first guess: the lr, one up, one down
    count = _progress.Progress(len(sizes) * per_size, approx=True, live=False)
    sweep = _Sweep(spec, out, url, progress, on_run, [], count)
    grid = sorted(spec.lrs)
    guess = grid[-1]
    examples_needed: float | None = None
    for swept, batch_size in enumerate(sizes):
        if swept:  # the runs each batch size took so far, for the ones still to come
            count.total = count.done + round(count.done / swept * (len(sizes) - swept))
        sweep.batch_size = batch_size
        sweep.best_steps = sweep.best_lr = None
        sweep.at_size = []
        sweep.budget_at = (
            None if examples_needed is None else CAP_FACTOR * examples_needed / batch_size
        )
        start = grid.index(guess)
        sweep.evaluate(grid[start])
        i = start + 1
        while i < len(grid) and sweep.evaluate(grid[i]):
            i += 1
        i = start - 1
        while i >= 0 and (sweep.evaluate(grid[i]) or sweep.best_steps is None):
            i -= 1
        if sweep.best_steps is not None and sweep.best_lr is not None:
            guess = sweep.best_lr
            needed = sweep.best_steps * batch_size
            examples_needed = needed if examples_needed is None else min(examples_needed, needed)
    count.total, count.approx = count.done, False
    return sweep.records


def load_runs(out: Path, spec: TaskSpec) -> list[RunRecord]:
    """All cached records of a task (for re-analysis without training)."""
    folder = task_dir(out, spec)
    return [json.loads(p.read_text()) for p in sorted(folder.glob("B*-lr*-s*.json"))]
