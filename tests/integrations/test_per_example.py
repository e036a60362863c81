"""Both callbacks on one process with one backward per step: per-example norms.

Without accumulation a step has one batch size, so the callbacks measure each example's own
gradient (``GradientNoiseProbe``'s "auto" source: B_small = 1 example, or the example's real
label tokens). Each test trains a few steps through the framework and the same steps in a
hand-written loop with ``GradientNoiseProbe(source="per_example")`` on the same initial weights
and batches: the samples the server stored equal the loop's (rel 1e-6). Clipping is on and tiny,
so a measurement taken after it could not match; fp16 runs with a ``GradScaler`` at 1024.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import lightning.pytorch as pl
import pytest
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader
from transformers import Trainer, TrainingArguments

from harness import QUIET_HF, QUIET_LIGHTNING, ServerProcess
from noisescope.integrations import HuggingFaceCallback, LightningCallback
from noisescope.torch import GradientNoiseProbe
from tests.integrations._lit import DigitsMLP, digits_loader
from tests.integrations._tiny import (
    ByteLMDataset,
    RecordedBatches,
    Recorder,
    RecordingCollator,
    tiny_gpt2,
    tiny_llama,
    unpad,
)
from tests.integrations.conftest import stored_run
from tests.integrations.test_hf import DigitsDataset, MeanLossClassifier

LR = 0.1
CLIP = 0.01


def _assert_equal_samples(
    stored: list[dict[str, Any]], loop: list[dict[str, Any]], rel: float = 1e-6
) -> None:
    assert [s["step"] for s in stored] == [s["step"] for s in loop]
    for got, want in zip(stored, loop, strict=True):
        assert (got["b_small"], got["b_big"]) == pytest.approx((want["b_small"], want["b_big"]))
        for key in ("g_small_sq", "g_big_sq"):
            assert got[key] == pytest.approx(want[key], rel=rel), key


def _notices(server: ServerProcess, run_id: str) -> list[str]:
    events = httpx.get(f"{server.url}/api/v1/runs/{run_id}/events", timeout=30).json()
    return [e["payload"]["message"] for e in events if e["kind"] == "notice"]


# --- Hugging Face -------------------------------------------------------------------------------


def _hf_args(tmp_path: Path, **overrides: Any) -> TrainingArguments:
    settings: dict[str, Any] = {
        "output_dir": str(tmp_path / "out"),
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 1,
        "max_steps": 4,
        "max_grad_norm": CLIP,
        **QUIET_HF,
    }
    settings.update(overrides)
    return TrainingArguments(**settings)


def _sgd(model: nn.Module) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """Plain SGD at a constant lr: the hand-written loop repeats the Trainer's steps exactly."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)


def _hf_callback(server: ServerProcess, tmp_path: Path, **kwargs: Any) -> HuggingFaceCallback:
    return HuggingFaceCallback(
        project="integrations", url=server.url, dir=tmp_path / "spool", quiet=True, **kwargs
    )


@contextlib.contextmanager
def _items_seen(model: nn.Module) -> Iterator[list[Any]]:
    """The ``num_items_in_batch`` the Trainer hands each training forward."""
    seen: list[Any] = []

    def record(module: nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        if module.training and torch.is_grad_enabled():
            seen.append(kwargs.get("num_items_in_batch"))

    handle = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        yield seen
    finally:
        handle.remove()


def _gpt2_without_dropout() -> nn.Module:
    return tiny_gpt2(dropout=0.0)  # the loop must repeat the Trainer's forwards exactly


@pytest.mark.parametrize(
    "make", [tiny_llama, _gpt2_without_dropout], ids=["llama", "gpt2-tied-broadcast"]
)
def test_hf_tokens_one_backward_per_step_measures_each_examples_tokens(
    server: ServerProcess, tmp_path: Path, make: Callable[[], nn.Module]
) -> None:
    """A causal LM on padded byte sequences (Llama, untied; GPT-2, its embedding tied to the
    head and its positions broadcast): B_small is the harmonic mean of the examples' real label
    tokens (after the shift), B_big their sum, and every sample equals the plain loop's, whose
    loss is the summed token loss over the Trainer's item count."""
    collator = RecordingCollator()
    model = make()
    callback = _hf_callback(server, tmp_path)
    trainer = Trainer(
        model=model,
        args=_hf_args(tmp_path),
        train_dataset=ByteLMDataset(16),
        data_collator=collator,
        optimizers=_sgd(model),
        callbacks=[callback],
    )
    with _items_seen(model) as n_items:
        trainer.train()
    assert callback.run is not None
    stored = stored_run(server, callback.run.id)
    assert stored.run["units"] == "tokens"
    assert len(stored.samples) == 4

    reference = make()  # the same initial weights
    recorder = Recorder("tokens")
    probe = GradientNoiseProbe(reference, recorder, source="per_example")
    optimizer = torch.optim.SGD(reference.parameters(), lr=LR)
    for labels, n in zip(collator.labels, n_items, strict=True):
        loss = reference(**unpad(labels), num_items_in_batch=n).loss
        loss.backward()
        counts = labels[:, 1:].ne(-100).sum(1)  # the loss predicts positions 1..T-1
        probe.micro_step(batch_size=float(counts.sum()), grad_scale=float(counts.sum()) / float(n),
                         item_counts=counts)  # fmt: skip
        probe.step(loss=loss.item(), lr=LR)
        nn.utils.clip_grad_norm_(reference.parameters(), CLIP)
        optimizer.step()
        optimizer.zero_grad()

    for sample, labels in zip(stored.samples, collator.labels, strict=True):
        tokens = [float(n) for n in labels[:, 1:].ne(-100).sum(1)]
        assert sample["b_small"] == pytest.approx(len(tokens) / sum(1 / n for n in tokens))
        assert sample["b_big"] == pytest.approx(sum(tokens))
    _assert_equal_samples(stored.samples, recorder.samples)


def test_hf_examples_one_backward_per_step_has_b_small_1(
    server: ServerProcess, tmp_path: Path
) -> None:
    """A classifier with a mean loss (no loss kwargs): B_small = 1 example, B_big = 4."""
    batches = RecordedBatches()

    model = MeanLossClassifier()
    callback = _hf_callback(server, tmp_path, task="digits-mlp")
    trainer = Trainer(
        model=model,
        args=_hf_args(tmp_path),
        train_dataset=DigitsDataset(16),
        data_collator=batches,
        optimizers=_sgd(model),
        callbacks=[callback],
    )
    trainer.train()
    assert callback.run is not None
    stored = stored_run(server, callback.run.id)
    assert stored.run["units"] == "examples"
    assert [(s["b_small"], s["b_big"]) for s in stored.samples] == [(1, 4)] * 4

    reference = MeanLossClassifier()  # seeds itself: the same initial weights
    recorder = Recorder("examples")
    probe = GradientNoiseProbe(reference, recorder, source="per_example")
    optimizer = torch.optim.SGD(reference.parameters(), lr=LR)
    for batch in batches:
        loss = reference(**batch)["loss"]
        loss.backward()
        probe.step(batch_size=len(batch["labels"]), loss=loss.item(), lr=LR)
        nn.utils.clip_grad_norm_(reference.parameters(), CLIP)
        optimizer.step()
        optimizer.zero_grad()
    _assert_equal_samples(stored.samples, recorder.samples)


def test_hf_fp16_per_example_divides_the_loss_scale_out(
    server: ServerProcess, tmp_path: Path
) -> None:
    """fp16 with a ``GradScaler`` the test installs (accelerate makes none on the CPU): the same
    training at scale 1024 and at scale 1 logs the same per-example samples (rel 1e-3: the
    half-precision backward rounds, and underflows, differently at the two scales; a scale not
    divided out would be 1024^2 off)."""
    samples = {}
    for scale in (1.0, 1024.0):
        model = tiny_llama()
        callback = _hf_callback(server, tmp_path)
        trainer = Trainer(
            model=model,
            args=_hf_args(tmp_path, fp16=True, max_steps=2),
            train_dataset=ByteLMDataset(8),
            data_collator=RecordingCollator(),
            optimizers=_sgd(model),
            callbacks=[callback],
        )
        trainer.accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=scale)
        trainer.train()
        assert callback.run is not None
        samples[scale] = stored_run(server, callback.run.id).samples
    assert len(samples[1.0]) == 2
    assert all(s["b_small"] < s["b_big"] for s in samples[1024.0])
    _assert_equal_samples(samples[1024.0], samples[1.0], rel=1e-3)


class _BatchNormClassifier(MeanLossClassifier):
    """BatchNorm mixes the examples of a batch: per-example gradients are not defined."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 32), nn.BatchNorm1d(32), nn.Linear(32, 10))


def test_hf_model_without_per_example_norms_says_why_and_trains_on(
    server: ServerProcess, tmp_path: Path
) -> None:
    """No per-example norms for this model: nothing is logged, the run's page says why and
    that accumulation would measure it, and training goes on."""
    callback = _hf_callback(server, tmp_path, task="digits-bn")
    trainer = Trainer(
        model=_BatchNormClassifier(),
        args=_hf_args(tmp_path, max_steps=2),
        train_dataset=DigitsDataset(8),
        callbacks=[callback],
    )
    with pytest.warns(UserWarning, match="noisescope"):
        trainer.train()
    assert trainer.state.global_step == 2
    assert callback.run is not None
    assert stored_run(server, callback.run.id).samples == []
    notices = " ".join(_notices(server, callback.run.id))
    assert "BatchNorm" in notices
    assert "accumulation" in notices


# --- Lightning ----------------------------------------------------------------------------------


def _lightning(callbacks: list[Any], **overrides: Any) -> pl.Trainer:
    settings: dict[str, Any] = {
        "max_epochs": 1,
        "accumulate_grad_batches": 1,
        "gradient_clip_val": CLIP,
        "accelerator": "cpu",
        "devices": 1,
        "callbacks": callbacks,
        **QUIET_LIGHTNING,
    }
    settings.update(overrides)
    return pl.Trainer(**settings)


def _lightning_callback(server: ServerProcess, tmp_path: Path, **kwargs: Any) -> LightningCallback:
    return LightningCallback(
        project="integrations", url=server.url, dir=tmp_path, quiet=True, **kwargs
    )


def _plain_loop(
    module: pl.LightningModule,
    batches: list[Any],
    loss_of: Callable[[Any], Tensor],
    probe: GradientNoiseProbe,
    items: Callable[[Any], Tensor] | None = None,
    scaler: torch.amp.GradScaler | None = None,
) -> None:
    """``DigitsMLP``'s optimizer (SGD, momentum 0.9) and clipping, by hand; fp16 as Lightning's
    ``MixedPrecision`` does it (autocast, scaled backward, un-scale, clip, scaler step)."""
    optimizer = torch.optim.SGD(module.parameters(), lr=module.hparams["lr"], momentum=0.9)
    for batch in batches:
        with torch.autocast("cpu", dtype=torch.half, enabled=scaler is not None):
            loss = loss_of(batch)
        (loss if scaler is None else scaler.scale(loss)).backward()
        counts = None if items is None else items(batch)
        size = len(batch[0]) if counts is None else float(counts.sum())
        probe.step(batch_size=size, item_counts=counts, loss=loss.item(), lr=0.05)
        if scaler is not None:
            scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(module.parameters(), CLIP)
        if scaler is None:
            optimizer.step()
        else:
            scaler.step(optimizer)
            scaler.update()
        optimizer.zero_grad()


def _digits_loss(module: DigitsMLP) -> Callable[[Any], Tensor]:
    return lambda batch: nn.functional.cross_entropy(module.net(batch[0]), batch[1])


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_lightning_examples_one_backward_per_step_has_b_small_1(
    server: ServerProcess, tmp_path: Path, fp16: bool
) -> None:
    """The digits MLP, ``accumulate_grad_batches=1``: B_small = 1, B_big = 16, the plain
    loop's samples, before the (tiny) clipping; fp16: ``16-mixed`` with a scaler at 1024."""
    from lightning.pytorch.plugins import MixedPrecision

    def scaler() -> torch.amp.GradScaler | None:
        return torch.amp.GradScaler("cpu", init_scale=1024.0) if fp16 else None

    torch.manual_seed(0)
    module = DigitsMLP()
    callback = _lightning_callback(server, tmp_path, task="digits")
    plugins = [MixedPrecision("16-mixed", "cpu", scaler=scaler())] if fp16 else []
    _lightning([callback], plugins=plugins).fit(module, digits_loader(16, n=64))
    assert callback.run is not None
    stored = stored_run(server, callback.run.id)
    assert [(s["b_small"], s["b_big"]) for s in stored.samples] == [(1, 16)] * 4

    torch.manual_seed(0)
    reference = DigitsMLP()
    recorder = Recorder("examples")
    loop_scaler = scaler()
    probe = GradientNoiseProbe(reference, recorder, source="per_example", scaler=loop_scaler)
    batches = list(digits_loader(16, n=64))
    _plain_loop(reference, batches, _digits_loss(reference), probe, scaler=loop_scaler)
    _assert_equal_samples(stored.samples, recorder.samples)


class _TinyLM(pl.LightningModule):
    """Embedding + Linear language model, mean loss over the real label tokens."""

    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        torch.manual_seed(0)
        self.embed = nn.Embedding(257, 16)
        self.head = nn.Linear(16, 257)

    def loss(self, batch: dict[str, Tensor]) -> Tensor:
        logits = self.head(self.embed(batch["input_ids"]))[:, :-1]
        return nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"][:, 1:].flatten())

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        return self.loss(batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams["lr"], momentum=0.9)


def _tokens(batch: dict[str, Tensor]) -> Tensor:
    return batch["labels"][:, 1:].ne(-100).sum(1)


def test_lightning_tokens_one_backward_per_step_measures_each_examples_tokens(
    server: ServerProcess, tmp_path: Path
) -> None:
    """``units="tokens"`` with a ``batch_size_fn`` that counts each example's real tokens:
    B_small their harmonic mean, B_big their sum, the plain loop's samples. A count for the
    whole batch cannot weigh the examples: the callback says so and measures nothing."""
    collator = RecordingCollator()
    loader = DataLoader(ByteLMDataset(16), batch_size=4, collate_fn=collator)
    module = _TinyLM()
    callback = _lightning_callback(server, tmp_path, task="tiny-lm", units="tokens",
                                   batch_size_fn=_tokens)  # fmt: skip
    _lightning([callback]).fit(module, loader)
    assert callback.run is not None
    stored = stored_run(server, callback.run.id)
    assert len(stored.samples) == 4
    for sample, labels in zip(stored.samples, collator.labels, strict=True):
        counts = [float(n) for n in labels[:, 1:].ne(-100).sum(1)]
        assert sample["b_small"] == pytest.approx(len(counts) / sum(1 / n for n in counts))
        assert sample["b_big"] == pytest.approx(sum(counts))

    reference = _TinyLM()
    recorder = Recorder("tokens")
    probe = GradientNoiseProbe(reference, recorder, source="per_example")
    batches = [unpad(labels) for labels in collator.labels]
    _plain_loop(reference, batches, reference.loss, probe, items=_tokens)
    _assert_equal_samples(stored.samples, recorder.samples)

    def whole_batch(batch: dict[str, Tensor]) -> Tensor:
        return _tokens(batch).sum()

    callback = _lightning_callback(server, tmp_path, task="tiny-lm", units="tokens",
                                   batch_size_fn=whole_batch)  # fmt: skip
    with pytest.warns(UserWarning, match="one count per example"):
        _lightning([callback], max_steps=2).fit(_TinyLM(), loader)
    assert callback.run is not None
    assert stored_run(server, callback.run.id).samples == []
