"""The framework settings for a training run in a test or a benchmark: it writes nothing beside
what noisescope logs and prints nothing over the test or benchmark output.

Plain keyword dictionaries, so that this module needs neither Lightning nor transformers.
"""

from __future__ import annotations

from typing import Any

#: ``lightning.pytorch.Trainer``: no logger, checkpoints, progress bar or model summary.
QUIET_LIGHTNING: dict[str, Any] = {
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
}

#: ``transformers.TrainingArguments``: on the CPU, seeded, no checkpoints, reporters or tqdm.
QUIET_HF: dict[str, Any] = {
    "save_strategy": "no",
    "report_to": [],
    "use_cpu": True,
    "seed": 0,
    "disable_tqdm": True,
}
