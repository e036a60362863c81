"""Integrations: training-step time with each framework callback vs the same training without it.

Both frameworks train the same small GPT-2 (built from a config, no download) on byte-level
text from a stdlib module, with gradient accumulation, on the CPU with one thread. Runs with and
without the callback alternate (AB BA ...) so drift on the shared machine hits both alike; each
optimizer step is timed by a tiny timing callback present in both variants, the first steps of
each run are dropped as warm-up, and the ratio of median step times is reported. The noisescope
run is a real one in offline mode (the background sender spools every sample to disk).

    python -m benchmarks.integrations [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

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


def _config(quick: bool) -> dict[str, Any]:
    return {
        "n_layer": 4,
        "n_embd": 64,
        "n_head": 4,
        "micro_batch": 8,
        "accumulation": 4,
        "steps": WARMUP_STEPS + (5 if quick else 8),
        "pairs": 2 if quick else 8,
    }


def _byte_blocks(n: int) -> list[list[int]]:
    data = Path(json.__file__).read_bytes() + Path(statistics.__file__).read_bytes()
    return [list(data[i * SEQ_LEN : (i + 1) * SEQ_LEN]) for i in range(n)]


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
        loss_type="ForCausalLM",
    )
    return GPT2LMHeadModel(config)


def _collate(features: list[Any]) -> dict[str, Any]:
    import torch

    ids = torch.tensor([f["input_ids"] if isinstance(f, dict) else f for f in features])
    return {"input_ids": ids, "labels": ids.clone()}


# --- Hugging Face Trainer -------------------------------------------------------------------


def _hf_step_times(cfg: dict[str, Any], with_callback: bool, spool: Path) -> list[float]:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from noisescope.integrations import HuggingFaceCallback

    stamps: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            if not stamps:
                stamps.append(_clock())

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            stamps.append(_clock())

    callbacks: list[Any] = [StepTimer()]
    if with_callback:
        callbacks.append(
            HuggingFaceCallback(project="bench", mode="offline", dir=spool, quiet=True)
        )
    n = cfg["micro_batch"] * cfg["accumulation"] * (cfg["steps"] + 1)
    data = [{"input_ids": block} for block in _byte_blocks(n)]
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=cfg["micro_batch"],
            gradient_accumulation_steps=cfg["accumulation"],
            max_steps=cfg["steps"],
            learning_rate=1e-3,
            max_grad_norm=1.0,
            logging_strategy="no",
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            seed=0,
            disable_tqdm=True,
        )
        trainer = Trainer(
            model=_model(cfg),
            args=args,
            train_dataset=data,  # type: ignore[arg-type]
            data_collator=_collate,
            callbacks=callbacks,
        )
        trainer.train()
    return [b - a for a, b in itertools.pairwise(stamps)][WARMUP_STEPS:]


# --- Lightning ------------------------------------------------------------------------------


def _lightning_step_times(cfg: dict[str, Any], with_callback: bool, spool: Path) -> list[float]:
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

    stamps: list[float] = []

    class StepTimer(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            if len(stamps) <= trainer.global_step:
                stamps.append(_clock())

    callbacks: list[Any] = [StepTimer()]
    if with_callback:
        callbacks.append(
            LightningCallback(
                project="bench",
                units="tokens",
                batch_size_fn=lambda b: b["labels"][:, 1:].numel(),
                mode="offline",
                dir=spool,
                quiet=True,
            )
        )
    n = cfg["micro_batch"] * cfg["accumulation"] * (cfg["steps"] + 1)
    loader = DataLoader(_byte_blocks(n), batch_size=cfg["micro_batch"], collate_fn=_collate)
    trainer = pl.Trainer(
        max_steps=cfg["steps"],
        accumulate_grad_batches=cfg["accumulation"],
        gradient_clip_val=1.0,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )
    trainer.fit(LM(), loader)
    return [b - a for a, b in itertools.pairwise(stamps)][WARMUP_STEPS:]


# --- driver ---------------------------------------------------------------------------------


def collect(quick: bool) -> dict[str, Any]:
    import logging

    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "transformers", "noisescope"):
        logging.getLogger(name).setLevel(logging.ERROR)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    cfg = _config(quick)
    results: dict[str, Any] = {"config": cfg, "rows": {}}
    frameworks = {"Hugging Face Trainer": _hf_step_times, "Lightning": _lightning_step_times}
    with tempfile.TemporaryDirectory() as spool_root:
        spool = Path(spool_root)
        for label, fn in frameworks.items():
            times: dict[bool, list[float]] = {False: [], True: []}
            pair_ratios = []
            fn(cfg | {"steps": WARMUP_STEPS + 2}, False, spool)  # imports, allocator warm-up
            for pair in range(cfg["pairs"]):
                order = (False, True) if pair % 2 == 0 else (True, False)
                medians = {}
                for with_cb in order:
                    step_times = fn(cfg, with_cb, spool)
                    times[with_cb] += step_times
                    medians[with_cb] = statistics.median(step_times)
                pair_ratios.append(medians[True] / medians[False])
            results["rows"][label] = {
                "none_ms": statistics.median(times[False]) * 1e3,
                "callback_ms": statistics.median(times[True]) * 1e3,
                "ratio": statistics.median(pair_ratios),
                "pair_ratios": sorted(pair_ratios),
                "steps": len(times[True]),
            }
    return results


def render(results: dict[str, Any], quick: bool) -> str:
    cfg = results["config"]
    lines = [
        "## Integrations: callback overhead (issue 6)",
        "",
        f"`python -m benchmarks.integrations{' --quick' if quick else ''}`: GPT-2 "
        f"({cfg['n_layer']} layers, width {cfg['n_embd']}, {SEQ_LEN}-token sequences) trained "
        f"with {cfg['accumulation']} micro-batches of {cfg['micro_batch']} per optimizer step, "
        f"CPU, 1 thread; {cfg['pairs']} pairs of runs (with / without, alternating order) of "
        f"{cfg['steps']} steps, first {WARMUP_STEPS} dropped. Step time is process CPU time "
        "(all threads: the sender's too), median per run; the ratio is the median over pairs "
        f"of the with/without ratio, the interval the pairs' min-max. Target "
        f"<= {TARGET_RATIO:.2f}x.",
        "",
        "| framework | no callback (ms/step) | noisescope callback (ms/step) | ratio | "
        "pairs min-max | target |",
        "|---|---:|---:|---:|---|---|",
    ]
    for label, row in results["rows"].items():
        ok = "met" if row["ratio"] <= TARGET_RATIO else "MISSED"
        reps = f"{row['pair_ratios'][0]:.3f}-{row['pair_ratios'][-1]:.3f}"
        lines.append(
            f"| {label} | {row['none_ms']:.1f} | {row['callback_ms']:.1f} | "
            f"{row['ratio']:.3f}x | {reps} | {ok} |"
        )
    return "\n".join(lines) + "\n"


def run(quick: bool) -> str:
    return render(collect(quick), quick)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.integrations", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer steps, for a smoke run")
    args = parser.parse_args(argv)
    print(run(args.quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
