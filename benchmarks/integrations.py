"""Integrations: training-step time with each framework callback vs the same training without it.

Both frameworks train the same small GPT-2 (built from a config, no download) on byte-level
text from a stdlib module, with gradient accumulation, on the CPU with one thread, at two widths
(64 and 256) with the same 52 parameter tensors: the callback's work is mostly fixed per tensor
and micro-batch, the step's grows with the width. Runs with and
without the callback alternate (AB BA ...) so drift on the shared machine hits both alike; each
optimizer step is timed by a tiny timing callback present in both variants, the first steps of
each run are dropped as warm-up, and the ratio of median step times is reported. The noisescope
run is a real one in offline mode (the background sender spools every sample to disk).

    python -m benchmarks.integrations [--quick]
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import _cli
from benchmarks._meter import Meter, NoiseGauge, metered
from harness import QUIET_HF, QUIET_LIGHTNING
from noisescope.integrations import CallbackOptions

TARGET_RATIO = 1.03


def _clock() -> float:
    """CPU seconds of the whole process (training thread + noisescope's sender thread).

    On a shared machine wall time mostly measures the neighbours; CPU time measures what the
    callback costs. Counting the sender thread too is conservative: with a spare core it would
    run alongside training rather than in its way.
    """
    return time.process_time()


WARMUP_STEPS = 3
SEQ_LEN = 64


def _callback_entry_points() -> list[tuple[type, str]]:
    from noisescope.integrations._hf import HuggingFaceCallback
    from noisescope.integrations._lightning import LightningCallback

    return [
        (HuggingFaceCallback, "_before_forward"),
        (HuggingFaceCallback, "_after_forward"),
        (HuggingFaceCallback, "_after_backward"),
        (LightningCallback, "on_train_batch_start"),
        (LightningCallback, "on_before_backward"),
        (LightningCallback, "on_after_backward"),
    ]


def _configs(quick: bool) -> dict[str, dict[str, Any]]:
    """Two GPT-2 sizes with the same 52 parameter tensors: what noisescope does per step is
    mostly fixed per tensor and micro-batch, what the step costs grows with the width."""
    common = {
        "n_layer": 4,
        "n_head": 4,
        "micro_batch": 8,
        "accumulation": 4,
        "steps": WARMUP_STEPS + (5 if quick else 12),
        "alternating_steps": WARMUP_STEPS + (12 if quick else 80),
    }
    # width 64: steps are short and the adjacent-step ratios spread by several per cent, so
    # more of them (the median's error falls as 1/sqrt(pairs)) for a 3% target
    narrow = {"alternating_steps": WARMUP_STEPS + (12 if quick else 320)}
    # the callbacks' cheaper setting: two gradient reads per step, hooks only check a flag
    first = common | {"small_batches": "first"}
    return {
        "width 64": common | narrow | {"n_embd": 64, "pairs": 2 if quick else 14},
        # the runs ratio is context only: fewer pairs of the slower model
        "width 256": common | {"n_embd": 256, "pairs": 2 if quick else 4},
        "width 64, small_batches='first'": first
        | narrow
        | {"n_embd": 64, "pairs": 2 if quick else 4},
        "width 256, small_batches='first'": first | {"n_embd": 256, "pairs": 2},
    }


def _byte_blocks(n: int) -> list[list[int]]:
    data = Path(json.__file__).read_bytes() + Path(statistics.__file__).read_bytes()
    blocks = [list(data[i * SEQ_LEN : (i + 1) * SEQ_LEN]) for i in range(len(data) // SEQ_LEN)]
    return [blocks[i % len(blocks)] for i in range(n)]  # long runs go round the text again


def _model(cfg: dict[str, Any]) -> Any:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=256,
        n_positions=SEQ_LEN,
        n_embd=cfg["n_embd"],
        n_layer=cfg["n_layer"],
        n_head=cfg["n_head"],
    )
    return GPT2LMHeadModel(config)


def _collate(features: list[Any]) -> dict[str, Any]:
    import torch

    ids = torch.tensor([f["input_ids"] if isinstance(f, dict) else f for f in features])
    return {"input_ids": ids, "labels": ids.clone()}


Step = tuple[float, float, float]


def _callback_settings(cfg: dict[str, Any], spool: Path) -> CallbackOptions:
    """What both frameworks' callbacks are given: a real run, offline to the spool."""
    return {
        "project": "bench",
        "small_batches": cfg.get("small_batches", "all"),
        "mode": "offline",
        "dir": spool,
        "quiet": True,
    }


def _training_blocks(cfg: dict[str, Any]) -> list[list[int]]:
    """The byte blocks of one run: every micro-batch of its steps, and one step to spare."""
    return _byte_blocks(cfg["micro_batch"] * cfg["accumulation"] * (cfg["steps"] + 1))


@dataclass
class _TimedRun:
    """One training run's meter and spool, and what it records: a stamp per optimizer step
    and, when the callback alternates (``states`` given), whether each step was measured."""

    meter: Meter
    spool: Path
    states: list[bool] | None = None
    stamps: list[Step] = field(default_factory=list)

    def stamp(self) -> None:
        self.stamps.append((_clock(), self.meter.net_total(), self.meter.net_hooks()))

    def step_times(self, callback: Any, with_callback: bool, cfg: dict[str, Any]) -> list[Step]:
        """The run's step times, once a callback that took part is seen to have measured."""
        if with_callback:
            alternating = self.states is not None
            _check_measured(callback, cfg["steps"] // 2 - 1 if alternating else cfg["steps"])
        return _deltas(self.stamps)


#: One framework's training run: (config, with the callback?, its timed run) -> step times.
StepTimes = Callable[[dict[str, Any], bool, _TimedRun], list[Step]]


def _check_measured(callback: Any, steps: int) -> None:
    """A callback that disabled itself (it never raises into training) would time as free."""
    status = callback.run.status() if callback.run is not None else None
    logged = status.queued + status.sent + status.spooled if status is not None else 0
    if callback._disabled not in (None, INERT) or logged < steps:
        raise RuntimeError(
            f"{type(callback).__name__} logged {logged} samples in {steps} steps "
            f"(disabled: {callback._disabled!r}); its timing would mean nothing"
        )


INERT = "benchmark: inert on alternate steps"


def _toggle(callback: Any, states: list[bool]) -> None:
    """Steps alternating in one run: the callback measures on one step, is inert on the next.

    Inert: its hooks return at once (``_disabled`` set) and the probe is detached. Records
    whether the step that just ended was measured. Re-attaching the probe happens before the
    next step's clock starts, so it is charged to that (measured) step: a conservative choice.
    """
    active = callback._disabled is None
    states.append(active)
    probe = callback.probe
    if active:
        callback._disabled = INERT
        if probe is not None:
            probe.remove()
    else:
        callback._disabled = None
        if probe is not None:
            probe._install()


def _deltas(stamps: list[Step]) -> list[Step]:
    """Per optimizer step: (step CPU time, inside noisescope, of which hooks), warm-up dropped."""
    pairs = itertools.pairwise(stamps)
    return [(b[0] - a[0], b[1] - a[1], b[2] - a[2]) for a, b in pairs][WARMUP_STEPS:]


# --- Hugging Face Trainer -------------------------------------------------------------------


def _hf_step_times(cfg: dict[str, Any], with_callback: bool, timed: _TimedRun) -> list[Step]:
    from transformers import PrinterCallback, Trainer, TrainerCallback, TrainingArguments

    from noisescope.integrations import HuggingFaceCallback

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            if not timed.stamps:
                timed.stamp()

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            timed.stamp()
            if timed.states is not None:
                _toggle(callback, timed.states)

    callback = HuggingFaceCallback(**_callback_settings(cfg, timed.spool))
    callbacks: list[Any] = [StepTimer(), callback] if with_callback else [StepTimer()]
    data = [{"input_ids": block} for block in _training_blocks(cfg)]
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=cfg["micro_batch"],
            gradient_accumulation_steps=cfg["accumulation"],
            max_steps=cfg["steps"],
            learning_rate=1e-3,
            max_grad_norm=1.0,
            logging_strategy="no",
            **QUIET_HF,
        )
        trainer = Trainer(
            model=_model(cfg),
            args=args,
            train_dataset=data,
            data_collator=_collate,
            callbacks=callbacks,
        )
        trainer.remove_callback(PrinterCallback)  # keep stdout for the table
        trainer.train()
    return timed.step_times(callback, with_callback, cfg)


# --- Lightning ------------------------------------------------------------------------------


def _lightning_step_times(cfg: dict[str, Any], with_callback: bool, timed: _TimedRun) -> list[Step]:
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader

    from noisescope.integrations import LightningCallback

    class LM(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = _model(cfg)

        def training_step(self, batch: dict[str, Any], batch_idx: int) -> Any:
            return self.model(**batch).loss

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    class StepTimer(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            if len(timed.stamps) <= trainer.global_step:
                timed.stamp()
                if timed.states is not None and trainer.global_step > 0:
                    _toggle(callback, timed.states)

    options = _callback_settings(cfg, timed.spool)
    options["units"] = "tokens"
    callback = LightningCallback(batch_size_fn=lambda b: b["labels"][:, 1:].numel(), **options)
    callbacks: list[Any] = [StepTimer(), callback] if with_callback else [StepTimer()]
    blocks: Any = _training_blocks(cfg)  # a list is a map-style dataset
    loader: DataLoader[Any] = DataLoader(blocks, batch_size=cfg["micro_batch"], collate_fn=_collate)
    trainer = pl.Trainer(
        max_steps=cfg["steps"],
        accumulate_grad_batches=cfg["accumulation"],
        gradient_clip_val=1.0,
        accelerator="cpu",
        devices=1,
        callbacks=callbacks,
        **QUIET_LIGHTNING,
    )
    trainer.fit(LM(), loader)
    return timed.step_times(callback, with_callback, cfg)


# --- driver ---------------------------------------------------------------------------------


def collect(quick: bool) -> dict[str, Any]:
    import logging

    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "transformers", "noisescope"):
        logging.getLogger(name).setLevel(logging.ERROR)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    configs = _configs(quick)
    gauge = NoiseGauge()
    results: dict[str, Any] = {"configs": configs, "rows": {}, "gauge": gauge}
    frameworks = {"Hugging Face Trainer": _hf_step_times, "Lightning": _lightning_step_times}
    meter = Meter()
    with tempfile.TemporaryDirectory() as spool_root, metered(meter, _callback_entry_points()):
        spool = Path(spool_root)
        for size, cfg in configs.items():
            for label, fn in frameworks.items():
                print(f"[integrations] {label}, {size} ...", file=sys.stderr, flush=True)
                results["rows"][(label, size)] = _measure(fn, cfg, spool, meter, gauge)
    return results


def _measure(
    fn: StepTimes,
    cfg: dict[str, Any],
    spool: Path,
    meter: Meter,
    gauge: NoiseGauge,
) -> dict[str, Any]:
    """Runs ratio, alternating-steps ratio and time inside noisescope for one framework."""
    times: dict[bool, list[float]] = {False: [], True: []}
    inside: list[float] = []
    hooks: list[float] = []
    pair_ratios = []
    fn(cfg | {"steps": WARMUP_STEPS + 2}, True, _TimedRun(meter, spool))  # imports, warm-up
    for pair in range(cfg["pairs"]):
        order = (False, True) if pair % 2 == 0 else (True, False)
        medians = {}
        for with_cb in order:
            gauge.sample(3)
            steps = fn(cfg, with_cb, _TimedRun(meter, spool))
            times[with_cb] += [step[0] for step in steps]
            if with_cb:
                inside += [step[1] for step in steps]
                hooks += [step[2] for step in steps]
            medians[with_cb] = statistics.median(step[0] for step in steps)
        pair_ratios.append(medians[True] / medians[False])
    none = statistics.median(times[False])
    gauge.sample(3)
    alternating = _alternating(fn, cfg, spool, meter)
    gauge.sample(3)
    alt_q1, _, alt_q3 = statistics.quantiles(alternating, n=4)
    return {
        "alt_ratio": statistics.median(alternating),
        "alt_q1": alt_q1,
        "alt_q3": alt_q3,
        "alt_pairs": len(alternating),
        "none_ms": none * 1e3,
        "callback_ms": statistics.median(times[True]) * 1e3,
        "ratio": statistics.median(pair_ratios),
        "pair_ratios": sorted(pair_ratios),
        "inside_ms": statistics.median(inside) * 1e3,
        "hooks_ms": statistics.median(hooks) * 1e3,
        "inside_ratio": 1.0 + statistics.median(inside) / none,
        "steps": len(times[True]),
    }


def _alternating(fn: StepTimes, cfg: dict[str, Any], spool: Path, meter: Meter) -> list[float]:
    """Step-time ratios (measured / inert) of adjacent steps of one run, the callback toggled."""
    states: list[bool] = []
    steps = fn(cfg | {"steps": cfg["alternating_steps"]}, True, _TimedRun(meter, spool, states))
    states = states[WARMUP_STEPS:]
    if len(states) != len(steps):
        raise RuntimeError(f"{len(states)} step states for {len(steps)} timed steps")
    ratios = []
    for (t_a, *_), (t_b, *_), on_a, on_b in zip(
        steps[::2], steps[1::2], states[::2], states[1::2], strict=False
    ):
        if on_a == on_b:
            raise RuntimeError("adjacent steps must alternate between measured and inert")
        ratios.append(t_a / t_b if on_a else t_b / t_a)
    return ratios


def run(quick: bool) -> str:
    results = collect(quick)
    configs = results["configs"]
    cfg = next(iter(configs.values()))
    sizes = ", ".join(
        f"{size} ({c['pairs']} pairs, {c['alternating_steps']} alternating steps)"
        for size, c in configs.items()
    )
    lines = [
        "## Integrations: callback overhead",
        "",
        f"`python -m benchmarks.integrations{' --quick' if quick else ''}`: GPT-2 "
        f"({cfg['n_layer']} layers, {SEQ_LEN}-token sequences, 52 parameter tensors; {sizes}) "
        f"trained with {cfg['accumulation']} micro-batches of {cfg['micro_batch']} per optimizer "
        f"step, CPU, 1 thread; pairs of runs (with / without, alternating order) of "
        f"{cfg['steps']} steps, first {WARMUP_STEPS} dropped. Step time is process CPU time "
        "(all threads: the sender's too), median per run; *runs ratio* is the median over pairs "
        "of runs of the with/without ratio (min-max over pairs beside it): separate runs differ "
        "by more than the effect, so the target is judged on *alternating steps*: one run "
        "(of the steps given above) in which the callback measures on every other step "
        "and is inert on the others (hooks return at once, the probe detached; re-attaching "
        "it is charged to the measured step), the median of the adjacent-step ratios with "
        "their quartiles. *In noisescope* is the "
        "training thread's CPU time inside the callback, the probe and its gradient hooks per "
        "step (median), *hooks* the part spent in the probe's per-parameter gradient hooks, "
        "and *1 + in/none* the time in noisescope over the untracked step: a noise-free floor "
        "on the overhead. Rows marked `small_batches='first'` use the callbacks' cheaper "
        "setting (only each step's first micro-batch gives a G_small: two gradient reads per "
        "step, the per-parameter hooks only check a flag; tr(Sigma) noisier), the others the "
        "default `'all'`. "
        f"Target <= {TARGET_RATIO:.2f}x. " + results["gauge"].describe(),
        "",
        "| framework | model | no callback (ms/step) | with callback (ms/step) | runs ratio "
        "| pairs min-max | alternating steps ratio | q1-q3 | in noisescope (ms/step) "
        "| of which hooks | 1 + in/none | target |",
        "|---|---|---:|---:|---:|---|---:|---|---:|---:|---:|---|",
    ]
    for (label, size), row in results["rows"].items():
        ok = "met" if row["alt_ratio"] <= TARGET_RATIO else "MISSED"
        reps = f"{row['pair_ratios'][0]:.3f}-{row['pair_ratios'][-1]:.3f}"
        lines.append(
            f"| {label} | {size} | {row['none_ms']:.1f} | {row['callback_ms']:.1f} | "
            f"{row['ratio']:.3f}x | {reps} | {row['alt_ratio']:.3f}x | "
            f"{row['alt_q1']:.3f}-{row['alt_q3']:.3f} | {row['inside_ms']:.2f} | "
            f"{row['hooks_ms']:.2f} | {row['inside_ratio']:.3f}x | {ok} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(_cli.main("benchmarks.integrations", __doc__, run))
