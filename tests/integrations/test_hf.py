"""The Hugging Face Trainer callback, end to end against a real server.

Tiny models built from configs (nothing downloaded), a few optimizer steps with gradient
accumulation and clipping switched on. The expected batch sizes come from the batches the data
collator produced (real label tokens, padding excluded); the expected |G_big|^2 comes from the
Trainer's own ``grad_norm`` log, which is the norm *before* clipping: with ``max_grad_norm``
tiny, a measurement taken after clipping would be ~1e-4 and fail.
"""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import torch
from torch import Tensor, nn
from transformers import Trainer, TrainingArguments

from harness import QUIET_HF, ServerProcess
from noisescope.integrations import HuggingFaceCallback
from tests.integrations._subprocess import pythonpath as _pythonpath
from tests.integrations._tiny import (
    ByteLMDataset,
    RecordedBatches,
    RecordingCollator,
    tiny_gpt2,
)
from tests.integrations.conftest import assert_same_samples, stored_run
from tests.support.dynamo import compiled_counts

ROOT = Path(__file__).resolve().parents[2]


def _args(tmp_path: Path, **overrides: Any) -> TrainingArguments:
    settings: dict[str, Any] = {
        "output_dir": str(tmp_path / "out"),
        "run_name": "tiny-gpt2",
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 2,
        "max_steps": 4,
        "learning_rate": 1e-3,
        "max_grad_norm": 0.01,
        "logging_steps": 1,
        **QUIET_HF,
    }
    settings.update(overrides)
    return TrainingArguments(**settings)


def _callback(server: ServerProcess, tmp_path: Path, **kwargs: Any) -> HuggingFaceCallback:
    return HuggingFaceCallback(
        project="integrations", url=server.url, dir=tmp_path / "spool", quiet=True, **kwargs
    )


def _grad_norms(trainer: Trainer) -> list[float]:
    return [h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h]


def test_gpt2_token_counts_and_preclip_norms_reach_the_server(
    server: ServerProcess, tmp_path: Path
) -> None:
    collator = RecordingCollator()
    callback = _callback(server, tmp_path)
    trainer = Trainer(
        model=tiny_gpt2(),
        args=_args(tmp_path),
        train_dataset=ByteLMDataset(64),
        data_collator=collator,
        callbacks=[callback],
    )
    trainer.train()
    assert callback.run is not None
    stored = stored_run(server, callback.run.id)

    assert stored.run["units"] == "tokens"
    assert stored.run["name"] == "tiny-gpt2"
    config = stored.run["config"]
    config = json.loads(config) if isinstance(config, str) else config
    assert config["training_args"]["gradient_accumulation_steps"] == 2
    assert config["examples_per_step"] == 8
    assert [s["step"] for s in stored.samples] == [0, 1, 2, 3]

    norms = _grad_norms(trainer)
    assert len(norms) == 4
    for step, sample in enumerate(stored.samples):
        # the two micro-batches of this step, as the collator produced them
        micro_labels = collator.labels[2 * step : 2 * step + 2]
        # GPT-2's loss shifts labels: position 0 of each row predicts nothing
        n_tokens = [float(lab[:, 1:].ne(-100).sum()) for lab in micro_labels]
        trainer_n = sum(float(lab.ne(-100).sum()) for lab in micro_labels)
        assert sample["b_big"] == pytest.approx(sum(n_tokens))
        assert sample["b_small"] == pytest.approx(2 / sum(1 / n for n in n_tokens))
        # the Trainer divides the summed token loss by its own count; G_big is the mean
        # gradient over the real tokens, so it is the Trainer's gradient rescaled
        expected_big = norms[step] ** 2 * (trainer_n / sum(n_tokens)) ** 2
        assert sample["g_big_sq"] == pytest.approx(expected_big, rel=1e-4)
        assert math.isfinite(sample["g_small_sq"])
        assert sample["g_small_sq"] > 0
        assert math.isfinite(sample["loss"])
        assert sample["lr"] == pytest.approx(trainer.args.learning_rate * (1 - step / 4))
    # micro-batch gradients are noisier than their average: E|G_small|^2 > E|G_big|^2 (eq. 1)
    mean_small = sum(s["g_small_sq"] for s in stored.samples) / 4
    mean_big = sum(s["g_big_sq"] for s in stored.samples) / 4
    assert mean_small > mean_big


def test_fp16_loss_scale_is_divided_out(server: ServerProcess, tmp_path: Path) -> None:
    """Gradients scaled by a GradScaler (x1024) are measured un-scaled.

    accelerate builds no GradScaler on the CPU, so the test installs one (the Trainer then
    scales the loss and, on the CPU, never un-scales: its logged grad_norm is 1024x too big).
    The callback must hand the optimizer's scaler to the probe, which divides by 1024^2.
    """
    collator = RecordingCollator()
    callback = _callback(server, tmp_path)
    trainer = Trainer(
        model=tiny_gpt2(),
        args=_args(tmp_path, fp16=True, max_steps=2),
        train_dataset=ByteLMDataset(64),
        data_collator=collator,
        callbacks=[callback],
    )
    trainer.accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    trainer.train()
    assert callback.run is not None
    stored = stored_run(server, callback.run.id)
    norms = _grad_norms(trainer)
    assert len(stored.samples) == 2
    for step, sample in enumerate(stored.samples):
        micro_labels = collator.labels[2 * step : 2 * step + 2]
        n_tokens = sum(float(lab[:, 1:].ne(-100).sum()) for lab in micro_labels)
        trainer_n = sum(float(lab.ne(-100).sum()) for lab in micro_labels)
        expected_big = (norms[step] / 1024.0) ** 2 * (trainer_n / n_tokens) ** 2
        assert sample["g_big_sq"] == pytest.approx(expected_big, rel=1e-3)


class MeanLossClassifier(nn.Module):
    """A plain nn.Module whose forward takes no loss kwargs: the Trainer divides by k."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))

    def forward(self, x: Tensor, labels: Tensor) -> dict[str, Tensor]:
        logits = self.net(x)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


class DigitsDataset(torch.utils.data.Dataset[dict[str, Tensor]]):
    def __init__(self, n: int) -> None:
        from sklearn.datasets import load_digits

        digits = load_digits()
        self.x = torch.tensor(digits.data[:n], dtype=torch.float32) / 16.0
        self.y = torch.tensor(digits.target[:n], dtype=torch.long)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}


def test_a_measurement_that_fails_stops_measuring_and_says_why_never_training(
    server: ServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    measure = HuggingFaceCallback._step
    calls = [0]

    def breaks_at_the_second_step(self: HuggingFaceCallback, micro: Any) -> None:
        calls[0] += 1
        if calls[0] == 2:
            raise RuntimeError("probe broke")
        measure(self, micro)

    monkeypatch.setattr(HuggingFaceCallback, "_step", breaks_at_the_second_step)
    callback = _callback(server, tmp_path, task="digits-mlp")
    args = _args(tmp_path, gradient_accumulation_steps=2, max_steps=3)
    trainer = Trainer(
        model=MeanLossClassifier(), args=args, train_dataset=DigitsDataset(24), callbacks=[callback]
    )
    with pytest.warns(UserWarning, match="not measuring this run"):
        trainer.train()
    assert trainer.state.global_step == 3 and calls[0] == 2  # trained on, measured no more
    assert callback.run is not None
    assert len(stored_run(server, callback.run.id).samples) == 1
    events = httpx.get(f"{server.url}/api/v1/runs/{callback.run.id}/events", timeout=30).json()
    notices = [e["payload"]["message"] for e in events if e["kind"] == "notice"]
    # the probe may also say which source it measures with; the callback says why it stopped
    assert [n for n in notices if n.startswith("not measuring")] == [
        "not measuring this run: measurement failed: RuntimeError('probe broke')"
    ]


def test_mean_loss_model_in_examples_with_a_short_last_cycle(
    server: ServerProcess, tmp_path: Path
) -> None:
    # 24 examples, 4 per micro-batch, 4 micro-batches per step: cycles of 4 and then 2
    callback = _callback(server, tmp_path, task="digits-mlp")
    args = _args(tmp_path, gradient_accumulation_steps=4, max_steps=-1, num_train_epochs=1)
    trainer = Trainer(
        model=MeanLossClassifier(), args=args, train_dataset=DigitsDataset(24), callbacks=[callback]
    )
    trainer.train()
    assert callback.run is not None
    stored = stored_run(server, callback.run.id)
    assert stored.run["units"] == "examples"
    assert stored.run["batch_size"] == 16
    assert [(s["b_small"], s["b_big"]) for s in stored.samples] == [(4, 16), (4, 8)]
    norms = _grad_norms(trainer)
    for sample, norm in zip(stored.samples, norms, strict=True):
        # mean loss / k: the accumulated gradient is the step's mean gradient
        assert sample["g_big_sq"] == pytest.approx(norm**2, rel=1e-4)
        assert sample["g_small_sq"] > 0


def test_torch_compile_logs_the_eager_samples_without_a_graph_break(
    server: ServerProcess, tmp_path: Path
) -> None:
    """``torch_compile=True`` (inductor): Accelerate hands the Trainer ``torch.compile(model)``,
    whose module call runs eagerly and the model's own call inside the graph. The same seeded
    training as the short-last-cycle test logs the eager samples (float32: rel 1e-6), and
    dynamo reports no graph break in the compiled forward, with the callback's hooks on."""
    samples = {}
    for compile_ in (False, True):
        callback = _callback(server, tmp_path, task="digits-mlp")
        args = _args(
            tmp_path,
            gradient_accumulation_steps=4,
            max_steps=-1,
            num_train_epochs=1,
            torch_compile=compile_,
        )
        trainer = Trainer(
            model=MeanLossClassifier(),
            args=args,
            train_dataset=DigitsDataset(24),
            callbacks=[callback],
        )
        with compiled_counts() as counts:
            trainer.train()
        assert callback.run is not None
        samples[compile_] = stored_run(server, callback.run.id).samples
    assert type(trainer.model_wrapped).__name__ == "OptimizedModule"  # the Trainer compiled it
    assert counts.graphs >= 1
    assert counts.graph_breaks == {}, counts.graph_breaks
    assert len(samples[False]) == 2
    assert_same_samples(samples[False], samples[True], rel=1e-6)


def test_small_batches_first_measures_the_first_micro_batch_only(
    server: ServerProcess, tmp_path: Path
) -> None:
    batches = RecordedBatches()

    model = MeanLossClassifier()
    reference = copy.deepcopy(model)  # the initial weights
    callback = _callback(server, tmp_path, task="digits-mlp", small_batches="first")
    args = _args(tmp_path, gradient_accumulation_steps=4, max_steps=1)
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=DigitsDataset(24),
        data_collator=batches,
        callbacks=[callback],
    )
    trainer.train()
    reference(**batches[0])["loss"].backward()
    # cast: .grad is Tensor | None; the backward above set every parameter's
    first_sq = sum(
        float(cast(Tensor, p.grad).double().square().sum()) for p in reference.parameters()
    )
    assert callback.run is not None
    (sample,) = stored_run(server, callback.run.id).samples
    assert (sample["b_small"], sample["b_big"]) == (4, 16)
    assert sample["g_small_sq"] == pytest.approx(first_sq, rel=1e-5)
    assert sample["g_big_sq"] == pytest.approx(_grad_norms(trainer)[0] ** 2, rel=1e-4)
    with pytest.raises(ValueError, match="small_batches"):
        HuggingFaceCallback(small_batches="some")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="units"):
        HuggingFaceCallback(units="pixels")
    # a typo fails here, not at the first training step (unmeasured)
    with pytest.raises(TypeError, match=r"'projet' \(did you mean 'project'\?\)"):
        HuggingFaceCallback(projet="p")  # type: ignore[call-arg]


def _train_params(tmp_path: Path, callbacks: list[Any]) -> dict[str, Tensor]:
    trainer = Trainer(
        model=tiny_gpt2(seed=1),
        args=_args(tmp_path, max_steps=3),
        train_dataset=ByteLMDataset(48, seed=1),
        data_collator=RecordingCollator(),
        callbacks=callbacks,
    )
    trainer.train()
    assert trainer.model is not None
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def test_parameters_identical_with_and_without_the_callback(
    server: ServerProcess, tmp_path: Path
) -> None:
    callback = _callback(server, tmp_path, layers=True)
    with_cb = _train_params(tmp_path, [callback])
    without = _train_params(tmp_path, [])
    assert callback.run is not None
    assert callback.run.status().sent > 0  # it did measure (per-layer series too)
    assert with_cb.keys() == without.keys()
    changed = [k for k in with_cb if not torch.equal(with_cb[k], without[k])]
    assert changed == []


def test_importing_noisescope_stays_light() -> None:
    code = (
        "import sys, noisescope, noisescope.integrations as i\n"
        "assert i.__all__ == "
        "['BranchOptions', 'CallbackOptions', 'HuggingFaceCallback', 'LightningCallback']\n"
        "heavy = [m for m in ('torch', 'transformers', 'lightning', 'accelerate')"
        " if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.fixture(scope="module")
def two_ranks(server: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    """``_hf_two_ranks.py`` under torch.distributed.run on 2 gloo processes (its DDP and FSDP2
    runs, 1 and 2 micro-batches per step): each rank's JSON result."""
    from harness import free_port

    out = tmp_path_factory.mktemp("hf-two-ranks")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": _pythonpath()}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    command += [
        "--master_port",
        str(free_port()),
        str(Path(__file__).with_name("_hf_two_ranks.py")),
    ]
    command += [server.url, str(out)]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def _assert_token_samples(
    stored: list[dict[str, Any]], ranks: list[dict[str, Any]], k: int
) -> None:
    """Two ranks, k micro-batches per step: B_small and B_big are the real label-token counts
    of the batches each rank's collator produced, |G_big|^2 the Trainer's pre-clipping norm.

    ``average_tokens_across_devices`` (the default) makes the Trainer divide by the token count
    of *both* ranks (unshifted) and multiply by the world size; the mean gradient over the real
    tokens is the Trainer's gradient rescaled.
    """
    assert [s["step"] for s in stored] == [0, 1, 2]
    for step, sample in enumerate(stored):
        micro = slice(k * step, k * step + k)
        n_tokens = [float(n) for r in ranks for n in r["shifted"][micro]]
        trainer_n = sum(float(n) for r in ranks for n in r["unshifted"][micro])
        assert sample["b_big"] == pytest.approx(sum(n_tokens))
        assert sample["b_small"] == pytest.approx(2 * k / sum(1 / n for n in n_tokens))
        expected_big = ranks[0]["grad_norms"][step] ** 2 * (trainer_n / sum(n_tokens)) ** 2
        assert sample["g_big_sq"] == pytest.approx(expected_big, rel=1e-4)
        assert sample["g_small_sq"] > 0


@pytest.mark.slow
def test_ddp_two_gloo_processes(server: ServerProcess, two_ranks: list[Any]) -> None:
    """Trainer under torch.distributed.run: per-rank micro-batches vs the all-reduced gradient
    (``average_tokens_across_devices`` on: B_big must still be the real token total)."""
    for k in (1, 2):
        ranks = [r[f"ddp_k{k}"] for r in two_ranks]
        assert ranks[0]["wrapped"] == "DistributedDataParallel"
        _assert_token_samples(stored_run(server, ranks[0]["run_id"]).samples, ranks, k)


@pytest.mark.slow
def test_accelerate_fsdp2_two_gloo_processes(server: ServerProcess, two_ranks: list[Any]) -> None:
    """Accelerate's FSDP2 plugin (``fsdp_config={"version": 2}``; its CPU gate lifted, see
    ``_hf_two_ranks.py``), 1 and 2 micro-batches per step: the probe finds the sharded GPT-2
    itself; each rank's local micro-batch gradient (before the reduce-scatter) is a G_small,
    the shards' squared norms summed over the ranks |G_big|^2. The same training under DDP
    gives the same samples."""
    for k in (1, 2):
        fsdp2, ddp = ([r[f"{wrapper}_k{k}"] for r in two_ranks] for wrapper in ("fsdp2", "ddp"))
        assert fsdp2[0]["wrapped"] == "FSDPGPT2LMHeadModel"  # the Trainer trained FSDP2
        sharded = stored_run(server, fsdp2[0]["run_id"]).samples
        replicated = stored_run(server, ddp[0]["run_id"]).samples
        _assert_token_samples(sharded, fsdp2, k)
        for a, b in zip(sharded, replicated, strict=True):
            assert (a["b_small"], a["b_big"]) == (b["b_small"], b["b_big"])
            assert a["g_small_sq"] == pytest.approx(b["g_small_sq"], rel=1e-4)
            assert a["g_big_sq"] == pytest.approx(b["g_big_sq"], rel=1e-4)
