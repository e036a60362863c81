"""Setups the callbacks cannot measure, refused before training, naming what is supported.

FSDP1 (``fsdp_config={"version": 1}``): the Trainer hands the callback its
``FullyShardedDataParallel`` wrapper, whose flat parameters hide each parameter's gradient.

DeepSpeed: they close a step before the optimizer steps and read ``.grad``, which ZeRO
empties into its partitions: measuring would log |G_big|^2 = 0. Lightning's
``DeepSpeedStrategy`` runs on CUDA only (its ``setup_environment`` refuses the CPU), so its
refusal is checked on the callback's ``on_train_start`` with a real strategy object; the
Trainer's ``deepspeed=`` config and Accelerate's ``ACCELERATE_USE_DEEPSPEED`` likewise on
``on_train_begin``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import TrainerControl, TrainerState

from noisescope.integrations import HuggingFaceCallback, LightningCallback
from tests.integrations._tiny import tiny_gpt2
from tests.integrations.test_hf import _args

SUPPORTED = "Use GradientNoiseProbe(engine, run) in a DeepSpeed training loop"


def _hf_callback(tmp_path: Path) -> HuggingFaceCallback:
    return HuggingFaceCallback(project="p", url="http://127.0.0.1:9", dir=tmp_path, quiet=True)


def test_hf_callback_refuses_the_trainers_deepspeed_config(tmp_path: Path) -> None:
    args = _args(tmp_path)
    args.deepspeed = {"zero_optimization": {"stage": 2}}  # what the Trainer hands on
    with pytest.raises(TypeError, match="Hugging Face callback does not support DeepSpeed"):
        _hf_callback(tmp_path).on_train_begin(
            args, TrainerState(), TrainerControl(), model=tiny_gpt2()
        )


def test_hf_callback_refuses_accelerates_deepspeed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = _args(tmp_path)  # before the flag: TrainingArguments would set DeepSpeed up
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    with pytest.raises(TypeError) as caught:
        _hf_callback(tmp_path).on_train_begin(
            args, TrainerState(), TrainerControl(), model=tiny_gpt2()
        )
    assert SUPPORTED in str(caught.value)


def test_lightning_callback_refuses_the_deepspeed_strategy(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed")  # the strategy's constructor needs it
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import DeepSpeedStrategy

    trainer = pl.Trainer(
        strategy=DeepSpeedStrategy(stage=2),
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
    )
    callback = LightningCallback(project="p", url="http://127.0.0.1:9", dir=tmp_path, quiet=True)
    with pytest.raises(TypeError, match="Lightning callback does not support DeepSpeed") as caught:
        callback.on_train_start(trainer, pl.LightningModule())
    assert SUPPORTED in str(caught.value)


def test_fsdp1_is_refused_before_training(tmp_path: Path) -> None:
    """FSDP1 (``fsdp_config={"version": 1}``): the Trainer hands the callback its
    ``FullyShardedDataParallel`` wrapper, whose flat parameters hide each parameter's
    gradient. Accelerate builds no FSDP1 plugin without an accelerator, so the wrapper is
    made here as Accelerate makes it, for real (gloo, one process)."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    from harness import free_port

    # TCPStore is public API, but torch.distributed imports it without re-exporting it
    store = torch.distributed.TCPStore("127.0.0.1", free_port(), 1, is_master=True)  # type: ignore[attr-defined]
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        wrapped = FullyShardedDataParallel(
            tiny_gpt2(), device_id=torch.device("cpu"), use_orig_params=True
        )
        callback = _hf_callback(tmp_path)
        with pytest.raises(TypeError, match=r"FSDP1 .*Accelerate's fsdp_version=2"):
            callback.on_train_begin(
                _args(tmp_path), TrainerState(), TrainerControl(), model=wrapped
            )
    finally:
        torch.distributed.destroy_process_group()


def test_lightning_callback_refuses_the_fsdp1_strategy(tmp_path: Path) -> None:
    """Lightning's ``FSDPStrategy`` (FSDP1) needs a GPU (its accelerator connector refuses
    ``accelerator="cpu"``), so a real strategy object is handed over on a stand-in trainer."""
    import types

    import lightning.pytorch as pl
    from lightning.pytorch.strategies import FSDPStrategy

    trainer = types.SimpleNamespace(strategy=FSDPStrategy())
    callback = LightningCallback(project="p", url="http://127.0.0.1:9", dir=tmp_path, quiet=True)
    with pytest.raises(TypeError, match=r"FSDP1 .*Lightning's ModelParallelStrategy"):
        callback.on_train_start(trainer, pl.LightningModule())  # type: ignore[arg-type]
