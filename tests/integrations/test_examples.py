"""The framework examples docs/integrations.md points to (``examples/hf_trainer.py``,
``examples/lightning_module.py``) run as written, shortened by their own options, and record
every measured step (offline: the spool, which ``noisescope sync`` sends later)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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
