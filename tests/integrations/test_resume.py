"""The Hugging Face and Lightning callbacks resume their run when the trainer resumes from a
checkpoint (issue 55 item 7): the checkpoint keeps the run's id, the resumed training continues
that run, and the steps it repeats after the checkpoint keep their first copy on the server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from transformers import Trainer, TrainingArguments

from harness import QUIET_HF, QUIET_LIGHTNING, ServerProcess
from noisescope.integrations import HuggingFaceCallback, LightningCallback
from tests.integrations._lit import DigitsMLP, digits_loader
from tests.integrations._tiny import ByteLMDataset, RecordingCollator, tiny_gpt2
from tests.integrations.conftest import stored_run


def _steps(server: ServerProcess, run_id: str) -> list[int]:
    return [int(sample["step"]) for sample in stored_run(server, run_id).samples]


def _lightning(tmp_path: Path, server: ServerProcess, max_steps: int) -> tuple[pl.Trainer, Any]:
    callback = LightningCallback(
        project="integrations", task="resume", url=server.url, dir=tmp_path / "spool", quiet=True
    )
    checkpoints = ModelCheckpoint(
        dirpath=tmp_path / "ckpt", every_n_train_steps=3, save_top_k=-1, filename="{step}"
    )
    settings = {**QUIET_LIGHTNING, "enable_checkpointing": True}
    trainer = pl.Trainer(
        max_steps=max_steps, accelerator="cpu", devices=1,
        callbacks=[callback, checkpoints], **settings,
    )  # fmt: skip
    return trainer, callback


def test_lightning_fit_from_a_checkpoint_continues_its_run(
    server: ServerProcess, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    first, callback = _lightning(tmp_path, server, max_steps=6)
    first.fit(DigitsMLP(), digits_loader(16, n=256))
    run_id = callback.run.id
    assert _steps(server, run_id) == list(range(6))

    second, resumed = _lightning(tmp_path, server, max_steps=10)
    second.fit(DigitsMLP(), digits_loader(16, n=256), ckpt_path=tmp_path / "ckpt" / "step=3.ckpt")
    assert resumed.run.id == run_id  # the checkpoint's run, continued
    assert _steps(server, run_id) == list(range(10))  # steps 3-5 once: the first copy
    status = resumed.run.status()
    assert status.dropped == 0 and status.sent == 4, status
    assert stored_run(server, run_id).run["status"] == "finished"


def test_hugging_face_resume_from_checkpoint_continues_its_run(
    server: ServerProcess, tmp_path: Path
) -> None:
    def trainer(max_steps: int) -> tuple[Trainer, HuggingFaceCallback]:
        callback = HuggingFaceCallback(
            project="integrations", url=server.url, dir=tmp_path / "spool", quiet=True
        )
        settings: dict[str, Any] = {**QUIET_HF, "save_strategy": "steps", "save_steps": 2}
        args = TrainingArguments(
            output_dir=str(tmp_path / "out"), per_device_train_batch_size=4,
            gradient_accumulation_steps=2, max_steps=max_steps, learning_rate=1e-3, **settings,
        )  # fmt: skip
        model = tiny_gpt2()
        return Trainer(
            model=model,
            args=args,
            train_dataset=ByteLMDataset(64),
            data_collator=RecordingCollator(),
            callbacks=[callback],
        ), callback

    first, callback = trainer(4)
    first.train()
    assert callback.run is not None
    run_id = callback.run.id
    before = _steps(server, run_id)
    assert len(before) == 4 and len(set(before)) == 4

    second, resumed = trainer(6)
    second.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    assert resumed.run is not None and resumed.run.id == run_id
    after = _steps(server, run_id)
    assert len(after) == len(set(after)) == 6 and after[:4] == before, after
    assert stored_run(server, run_id).run["status"] == "finished"
