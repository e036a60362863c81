"""The framework examples docs/integrations.md points to (``examples/hf_trainer.py``,
``examples/lightning_module.py``) run as written, shortened by their own options, and record
every measured step (offline: the spool, which ``noisescope sync`` sends later);
``examples/gpt2_finetune.py`` (no accumulation: per-example norms) against a real server, from
which it reads its B_simple back."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness import ServerProcess

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "options", "samples"),
    [
        # 4 optimizer steps, one sample each (4 micro-batches of 8: b_small 8, b_big 32)
        ("hf_trainer.py", ["--steps", "4", "--max-len", "32"], 4),
        # 1,797 digits in micro-batches of 16: 112 per epoch, 28 steps of 4
        ("lightning_module.py", ["--epochs", "1"], 28),
    ],
)
def test_example_runs_and_spools_a_sample_per_step(
    script: str, options: list[str], samples: int, tmp_path: Path
) -> None:
    pytest.importorskip("transformers" if script == "hf_trainer.py" else "lightning")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOISESCOPE_")}
    env.update(NOISESCOPE_DIR=str(tmp_path / "spool"), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), *options, "--mode", "offline"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    said = re.findall(r"spooled (\d+), dropped (\d+)", done.stdout + done.stderr)
    assert said and said[-1] == (str(samples), "0"), done.stderr[-3000:]


@pytest.mark.slow
def test_gpt2_finetune_without_accumulation_reads_its_b_simple_back(
    server: ServerProcess, tmp_path: Path
) -> None:
    """One process, one backward per step: a sample every step (per-example norms, B_small in
    tokens), and the script prints the run's current B_simple, read back with ``Api``."""
    pytest.importorskip("transformers")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOISESCOPE_")}
    env.update(NOISESCOPE_DIR=str(tmp_path / "spool"), OMP_NUM_THREADS="1")
    options = ["--url", server.url, "--steps", "64", "--batch", "4", "--max-len", "16"]
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "gpt2_finetune.py"), *options],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert ": 64 samples in tokens" in done.stdout, done.stdout + done.stderr[-3000:]
    assert re.search(r"^B_simple: ", done.stdout, flags=re.MULTILINE), done.stdout
